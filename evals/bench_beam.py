"""`tts bench engine --workload beam`: decoding in beam search's shape, side by side in one run.

4 prompts of ~1.5k tokens (a MATH-500 problem followed by earlier reasoning steps), each
forked n=4, 256 new tokens each, T=0.8, ignore EOS: 16 sequences whose contexts are almost
all shared by the 4 beams of their prompt. Output tokens/s of tts with the attention
switches off and on (the torch backend that copies the context out of the paged cache; the
in-place CPU kernel without and with cascade attention), HF `generate` with
num_return_sequences=4, and vLLM (n=4, prefix caching) when it is installed in this Python.

The earlier steps are the statements of the following MATH-500 problems, one per step:
real math text of the right length without minutes of generation before the benchmark
starts (attention cost depends on the lengths, not the words).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from evals.bench import SideBySide, write_report
from evals.datasets import load_problems
from tts_runtime.config import CacheConfig, EngineConfig
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import SamplingParams
from tts_runtime.models.loader import LoadedModel, load_model

# The tts variants: (label, what it measures, engine switches).
TTS_VARIANTS = (
    ("tts_torch", "torch backend: gathers each context per layer and step (before)",
     dict(attention_backend="torch")),
    ("tts_kernel", "CPU kernel in place, cascade off", dict(attention_backend="cpu", cascade_attention=False)),
    ("tts_cascade", "CPU kernel in place, cascade on (default)", dict(attention_backend="cpu", cascade_attention=True)),
)


@dataclass(frozen=True)
class BeamBenchConfig:
    generator: str = "smollm2-135m-instruct"
    prompts: int = 4
    n: int = 4
    prompt_tokens: int = 1500
    new_tokens: int = 256
    repeats: int = 3
    hf: bool = True
    dtype: torch.dtype = torch.float32


def beam_prompts(loaded: LoadedModel, count: int, target: int) -> list[list[int]]:
    """`count` chat prompts: a problem, then the following problems as the assistant's earlier
    steps until the prompt holds about `target` tokens."""
    problems = load_problems("math500", limit=count + 60)
    steps = [p.question.strip() + "\n\n" for p in problems[count:]]
    tok = loaded.tokenizer
    prompts = []
    for i in range(count):
        head = tok.apply_chat_template([{"role": "user", "content": problems[i].question}], tokenize=True,
                                       add_generation_prompt=True, return_dict=False)
        ids, k = list(head), i * 7
        while len(ids) < target:
            ids += tok.encode(steps[k % len(steps)], add_special_tokens=False)
            k += 1
        prompts.append(ids[:target])
    return prompts


def _tts(engine: Engine, prompts: list[list[int]], config: BeamBenchConfig) -> dict:
    params = SamplingParams(temperature=0.8, n=config.n, max_tokens=config.new_tokens, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    return {"tokens": sum(len(c.token_ids) for o in outputs for c in o.completions)}


def _hf(hf, tokenizer, prompts: list[list[int]], config: BeamBenchConfig) -> dict:
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=config.new_tokens,
                          min_new_tokens=config.new_tokens, do_sample=True, temperature=0.8, top_p=1.0, top_k=0,
                          num_return_sequences=config.n, pad_token_id=pad)
    return {"tokens": (out.shape[1] - width) * out.shape[0]}


def _vllm_runner(loaded: LoadedModel, config: BeamBenchConfig):
    """vLLM's offline engine on the same weights, or None when vLLM is not installed here."""
    if importlib.util.find_spec("vllm") is None:
        return None
    from vllm import LLM, SamplingParams as VllmParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(loaded.folder), dtype=str(config.dtype).removeprefix("torch."), enable_prefix_caching=True)
    params = VllmParams(n=config.n, temperature=0.8, max_tokens=config.new_tokens, ignore_eos=True)

    def run(prompts: list[list[int]]) -> dict:
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        return {"tokens": sum(len(c.token_ids) for o in outs for c in o.outputs)}

    return run


def bench_beam(config: BeamBenchConfig) -> tuple[SideBySide, dict[str, str]]:
    loaded = load_model(config.generator, config.dtype, torch.device("cpu"))
    prompts = beam_prompts(loaded, config.prompts, config.prompt_tokens)
    variants, labels = {}, {}
    for label, meaning, switches in TTS_VARIANTS:
        # Prefix caching off: every repetition prefills its prompts like the first (the forks
        # of a prompt still share its blocks).
        engine = Engine(config.generator, EngineConfig(cache=CacheConfig(enable_prefix_caching=False), **switches),
                        loaded=loaded)
        _tts(engine, [p[:64] for p in prompts], BeamBenchConfig(new_tokens=2))  # warm-up
        variants[label] = lambda e=engine: _tts(e, prompts, config)
        labels[label] = meaning
    if config.hf:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(loaded.folder, dtype=config.dtype).eval()
        variants["hf"] = lambda: _hf(hf, loaded.tokenizer, prompts, config)
        labels["hf"] = f"HF generate, num_return_sequences={config.n}"
    vllm = _vllm_runner(loaded, config)
    if vllm is not None:
        variants["vllm"] = lambda: vllm(prompts)
        labels["vllm"] = f"vLLM, n={config.n}, prefix caching on"
    side = SideBySide("beam")
    side.run(variants, config.repeats)
    return side, labels


def run_beam_bench(config: BeamBenchConfig, command: str) -> str:
    side, labels = bench_beam(config)
    rates = {k: side.median(k, "tokens") / side.median(k, "seconds") for k in side.runs}
    before = rates["tts_torch"]
    rows = [{"variant": k, "what": labels[k], "tokens/s": f"{rates[k]:.1f}",
             "vs tts_torch": f"{rates[k] / before:.2f}x"} for k in side.runs]
    if "vllm" not in side.runs:
        rows.append({"variant": "vllm", "what": "not installed in this Python (pip install vllm)",
                     "tokens/s": "-", "vs tts_torch": "-"})
    summary = {"tokens_per_s": rates, "speedup_vs_torch_backend": {k: r / before for k, r in rates.items()},
               "raw": side.runs}
    notes = [f"{config.prompts} prompts of {config.prompt_tokens} tokens, n={config.n}, {config.new_tokens} new "
             f"tokens each, T=0.8, ignore EOS, dtype {str(config.dtype).removeprefix('torch.')}; medians of "
             f"{config.repeats} alternating repetitions ({', '.join(side.runs)}, ...) in one process.",
             "Every tts repetition re-prefills its prompts (prefill is part of the time, as for HF); "
             "the prompt blocks are shared by the 4 forks of each prompt.",
             "Prompts: a MATH-500 problem, then the statements of the following problems as earlier steps.",
             "The profile that motivated the CPU kernel: `py-spy record -o beam.svg -- .venv/bin/tts beam "
             "--dataset math500 --limit 1 --num-iterations 4 --no-sort-completed --attention-backend torch` "
             "(drop the last option for the kernel); issue 15 measured `gather_kv` at 26% and the attention "
             "over its copies at 21% of such a run."]
    path = write_report("beam_decode", "Beam-shaped decode: tts attention switches vs HF (and vLLM)", command,
                        summary, rows, notes)
    return str(path)
