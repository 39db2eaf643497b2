"""`tts bench engine`: the engine against HF transformers, side by side in one run.

(a) generate: 64 prompts x 128 new tokens, T=0.8, ignore EOS, the generator model;
    output tokens/s of tts vs HF `generate` at batch 64, each at every dtype asked for.
(b) score: 16 beams x 8 steps sharing one question and their earlier steps, the PRM;
    tts with prefix caching vs an HF forward that re-encodes every whole sequence but
    projects only the scored (last) position onto the vocabulary (`logits_to_keep=1`, as
    an HF user would), so the ratio measures prefix reuse. HF with the full-vocabulary
    head at every position runs beside it: the head-only effect, on its own row.

Every side runs on the CPU, a GPU box too (`tts bench gpu` is the GPU comparison).
"""

from __future__ import annotations

from collections.abc import Sequence

from dataclasses import dataclass

import torch

from evals.bench import SideBySide, write_report
from search.prm import make_prm_format
from tts_runtime.config import ConfigError, EngineConfig, ModelSpec, resolve_dtype
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import SamplingParams
from tts_runtime.models.loader import LoadedModel, load_model
from tts_runtime.runs.datasets import DatasetConfig, load_problems
from tts_runtime.models.registry import DEFAULT_GENERATOR, DEFAULT_PRM
from tts_runtime.options import option


@dataclass(frozen=True)
class EngineBenchConfig:
    generator: str = DEFAULT_GENERATOR
    prm: str = DEFAULT_PRM
    num_prompts: int = option(64, "Generate workload: prompts.", at_least=1)
    new_tokens: int = option(128, "Generate workload: new tokens per prompt.", at_least=1)
    beams: int = option(16, "Score workload: beams.", at_least=1)
    steps: int = option(8, "Score workload: steps per beam.", at_least=1)
    repeats: int = option(3, "Alternating repetitions; medians reported (the beam workload's too).", at_least=1)
    dtypes: tuple[torch.dtype, ...] = option((torch.float32,), "Every side at each of these dtypes, e.g. "
                                             "float32,bfloat16 (beam workload: the first runs every tts variant, "
                                             "the others the oneDNN ones and, at bfloat16, the bf16-dot switch "
                                             "off; HF and vLLM run at each).", parse=lambda value: parse_dtypes(value))
    vllm: bool = False  # also both workloads on vLLM (evals/bench_vllm.py), in the same alternation


def _generate_prompts(loaded: LoadedModel, count: int) -> list[list[int]]:
    problems = load_problems(DatasetConfig(limit=count))
    tok = loaded.tokenizer
    return [tok.apply_chat_template([{"role": "user", "content": p.question}], tokenize=True,
                                    add_generation_prompt=True, return_dict=False) for p in problems]


def _hf_generate(hf, tokenizer, prompts: list[list[int]], new_tokens: int) -> dict:
    # Left padding, one batch: how HF users run batched generation.
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                          do_sample=True, temperature=0.8, top_p=1.0, top_k=0, pad_token_id=pad)
    return {"tokens": (out.shape[1] - width) * len(prompts)}


def _tts_generate(engine: Engine, prompts: list[list[int]], new_tokens: int) -> dict:
    params = SamplingParams(temperature=0.8, max_tokens=new_tokens, ignore_eos=True)
    outputs = engine.generate(prompts, params)
    return {"tokens": sum(len(o.completions[0].token_ids) for o in outputs)}


def bench_generate(config: EngineBenchConfig, dtype: torch.dtype) -> SideBySide:
    from transformers import AutoModelForCausalLM

    loaded = load_model(config.generator, dtype, torch.device("cpu"))
    hf = AutoModelForCausalLM.from_pretrained(loaded.folder, dtype=dtype).eval()
    prompts = _generate_prompts(loaded, config.num_prompts)
    spec = ModelSpec(config.generator, _name(dtype))
    engine = Engine(spec, EngineConfig(device="cpu"), loaded=loaded)
    # The length-grouped decode attention switched off: what that optimisation is worth (it
    # applies to the torch backend, the fallback when the CPU kernel is not built).
    ungrouped = Engine(spec, EngineConfig(device="cpu", attention_backend="torch", group_decodes_by_length=False), loaded=loaded)
    for warm in (engine, ungrouped):
        _tts_generate(warm, prompts[:4], 4)
    side = SideBySide("generate")
    variants = {
        "hf": lambda: _hf_generate(hf, loaded.tokenizer, prompts, config.new_tokens),
        "tts": lambda: _tts_generate(engine, prompts, config.new_tokens),
        "tts_ungrouped": lambda: _tts_generate(ungrouped, prompts, config.new_tokens),
    }
    if config.vllm:
        from evals.bench_vllm import generate_variant

        variants["vllm"] = generate_variant(loaded, dtype, prompts, config.new_tokens)
    side.run(variants, config.repeats)
    return side


def _beam_steps(config: EngineBenchConfig) -> tuple[str, list[list[str]]]:
    """One real question and `beams` diverging step sequences sampled by the generator."""
    problem = load_problems(DatasetConfig(limit=1))[0]
    loaded = load_model(config.generator, torch.float32, torch.device("cpu"))
    engine = Engine(config.generator, EngineConfig(device="cpu"), loaded=loaded)
    from search.prompts import PromptBuilder

    prompt = PromptBuilder(loaded.tokenizer).prompt_token_ids(problem.question)
    params = SamplingParams(temperature=0.8, n=config.beams, max_tokens=32, stop=("\n\n",), seed=0)
    beams: list[list[str]] = [[] for _ in range(config.beams)]
    contexts = [list(prompt) for _ in range(config.beams)]
    first = engine.generate([prompt], params)[0].completions
    for b, c in enumerate(first):
        beams[b].append(c.text.strip() or "(empty)")
        contexts[b] += c.token_ids
    for _ in range(config.steps - 1):
        step_params = SamplingParams(temperature=0.8, max_tokens=32, stop=("\n\n",), seed=1)
        outs = engine.generate(contexts, step_params)
        for b, o in enumerate(outs):
            beams[b].append(o.completions[0].text.strip() or "(empty)")
            contexts[b] += o.completions[0].token_ids
    return problem.question, beams


def _score_queries(prm: LoadedModel, question: str, beams: list[list[str]], steps: int):
    fmt = make_prm_format("judge", prm.tokenizer)
    return [[fmt.build(question, beam[: k + 1]) for beam in beams] for k in range(steps)]


def _tts_score(prm: LoadedModel, queries, dtype: torch.dtype) -> dict:
    engine = Engine(ModelSpec(prm.name, _name(dtype)), EngineConfig(device="cpu"), loaded=prm)
    for per_iteration in queries:  # iteration by iteration, like beam search
        engine.score([q.token_ids for q in per_iteration], [q.score_params() for q in per_iteration])
    return {"computed_tokens": engine.stats.computed_tokens}


def _hf_score(hf, queries, pad: int, *, last_only: bool) -> dict:
    """Left-padded batches, so every query's scored position is the last column: with
    `last_only` only that column goes through the output layer (`logits_to_keep=1`)."""
    computed = 0
    for per_iteration in queries:
        width = max(len(q.token_ids) for q in per_iteration)
        ids = torch.tensor([[pad] * (width - len(q.token_ids)) + q.token_ids for q in per_iteration])
        mask = torch.tensor([[0] * (width - len(q.token_ids)) + [1] * len(q.token_ids) for q in per_iteration])
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        with torch.inference_mode():
            hf(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=1 if last_only else 0)
        computed += sum(len(q.token_ids) for q in per_iteration)
    return {"computed_tokens": computed}


def bench_score(config: EngineBenchConfig, dtype: torch.dtype) -> SideBySide:
    from transformers import AutoModelForCausalLM

    question, beams = _beam_steps(config)
    prm = load_model(config.prm, dtype, torch.device("cpu"))
    hf = AutoModelForCausalLM.from_pretrained(prm.folder, dtype=dtype).eval()
    queries = _score_queries(prm, question, beams, config.steps)
    pad = prm.tokenizer.pad_token_id or 0
    side = SideBySide("score")
    variants = {"hf": lambda: _hf_score(hf, queries, pad, last_only=True),
                "hf_full_head": lambda: _hf_score(hf, queries, pad, last_only=False),
                "tts": lambda: _tts_score(prm, queries, dtype)}
    if config.vllm:
        from evals.bench_vllm import score_variant

        variants["vllm"] = score_variant(prm, dtype, queries)
    side.run(variants, config.repeats)
    return side


def parse_dtypes(text: str | Sequence[str]) -> tuple[torch.dtype, ...]:
    """`float32,bfloat16` (or a config file's list; `torch.` prefixes allowed) -> the dtypes (a
    bad name is a one-line ConfigError)."""
    items = text if isinstance(text, (list, tuple)) else str(text).split(",")
    names = [str(name).strip().removeprefix("torch.") for name in items if str(name).strip()]
    if not names:
        raise ConfigError("--dtypes needs at least one dtype, e.g. float32,bfloat16")
    return tuple(dict.fromkeys(resolve_dtype(name, torch.device("cpu")) for name in names))


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_rows(config: EngineBenchConfig, dtype: torch.dtype, gen: SideBySide, score: SideBySide) -> list[dict]:
    rates = {k: gen.median(k, "tokens") / gen.median(k, "seconds") for k in ("hf", "tts", "tts_ungrouped")}
    time_ = {k: score.median(k, "seconds") for k in ("hf", "hf_full_head", "tts")}
    tokens = {k: score.median(k, "computed_tokens") for k in ("hf", "tts")}
    d = _name(dtype)
    return [
        {"workload": f"generate {config.num_prompts}x{config.new_tokens} ({config.generator}), {d}",
         "hf": f"{rates['hf']:.1f} tok/s", "tts": f"{rates['tts']:.1f} tok/s",
         "ratio": f"{rates['tts'] / rates['hf']:.2f}x", "target": ">= 2.5x"},
        {"workload": f"generate, tts torch attention backend without length-grouped decodes, {d}",
         "hf": f"{rates['hf']:.1f} tok/s", "tts": f"{rates['tts_ungrouped']:.1f} tok/s",
         "ratio": f"{rates['tts_ungrouped'] / rates['hf']:.2f}x", "target": "(switch off)"},
        {"workload": f"score {config.beams} beams x {config.steps} steps ({config.prm}) wall time, HF "
                     f"logits_to_keep=1, {d}",
         "hf": f"{time_['hf']:.2f} s", "tts": f"{time_['tts']:.2f} s",
         "ratio": f"{time_['hf'] / time_['tts']:.2f}x less", "target": ">= 2x"},
        {"workload": f"score: head-only effect, HF full-vocabulary logits vs logits_to_keep=1, {d}",
         "hf": f"{time_['hf_full_head']:.2f} s", "tts": f"{time_['hf']:.2f} s (HF, last only)",
         "ratio": f"{time_['hf_full_head'] / time_['hf']:.2f}x less", "target": "(report)"},
        {"workload": f"score computed tokens, {d}",
         "hf": f"{tokens['hf']:.0f}", "tts": f"{tokens['tts']:.0f}",
         "ratio": f"{tokens['hf'] / tokens['tts']:.2f}x fewer", "target": ">= 3x"},
    ]


def _vllm_rows(dtype: torch.dtype, gen: SideBySide, score: SideBySide, summary: dict) -> list[dict]:
    from evals.bench_vllm import engine_rows

    rates = {k: gen.median(k, "tokens") / gen.median(k, "seconds") for k in ("tts", "vllm")}
    seconds = {k: score.median(k, "seconds") for k in ("tts", "vllm")}
    tokens = {k: score.median(k, "computed_tokens") for k in ("tts", "vllm")}
    summary["vllm"] = {"generate_tokens_per_s": rates["vllm"], "score_seconds": seconds["vllm"],
                       "score_computed_tokens": tokens["vllm"]}
    return engine_rows(_name(dtype), rates, seconds, tokens)


def _summary(gen: SideBySide, score: SideBySide) -> dict:
    rates = {k: gen.median(k, "tokens") / gen.median(k, "seconds") for k in ("hf", "tts", "tts_ungrouped")}
    time_ = {k: score.median(k, "seconds") for k in ("hf", "hf_full_head", "tts")}
    return {"generate_tokens_per_s": rates, "generate_ratio": rates["tts"] / rates["hf"],
            "score_seconds": time_, "score_time_ratio": time_["hf"] / time_["tts"],
            "head_only_ratio": time_["hf_full_head"] / time_["hf"],
            "score_computed_tokens": {k: score.median(k, "computed_tokens") for k in ("hf", "tts")},
            "raw": {"generate": gen.runs, "score": score.runs}}


def _best_rows(config: EngineBenchConfig, summaries: dict[str, dict]) -> list[dict]:
    """Each side at its own best dtype: what a user who picks the faster dtype gets."""
    def best(metric, side, pick):
        return pick(summaries, key=lambda d: summaries[d][metric][side])

    hf_gen = best("generate_tokens_per_s", "hf", max)
    tts_gen = best("generate_tokens_per_s", "tts", max)
    hf_score = best("score_seconds", "hf", min)
    tts_score = best("score_seconds", "tts", min)
    gen_hf = summaries[hf_gen]["generate_tokens_per_s"]["hf"]
    gen_tts = summaries[tts_gen]["generate_tokens_per_s"]["tts"]
    score_hf = summaries[hf_score]["score_seconds"]["hf"]
    score_tts = summaries[tts_score]["score_seconds"]["tts"]
    return [
        {"workload": f"generate, each at its best dtype (HF {hf_gen}, tts {tts_gen})",
         "hf": f"{gen_hf:.1f} tok/s", "tts": f"{gen_tts:.1f} tok/s", "ratio": f"{gen_tts / gen_hf:.2f}x",
         "target": ">= 2.5x"},
        {"workload": f"score wall time, each at its best dtype (HF {hf_score}, tts {tts_score})",
         "hf": f"{score_hf:.2f} s", "tts": f"{score_tts:.2f} s", "ratio": f"{score_hf / score_tts:.2f}x less",
         "target": ">= 2x"},
    ]


def run_engine_bench(config: EngineBenchConfig, command: str) -> str:
    rows: list[dict] = []
    summaries: dict[str, dict] = {}
    for dtype in config.dtypes:
        gen, score = bench_generate(config, dtype), bench_score(config, dtype)
        rows += _dtype_rows(config, dtype, gen, score)
        summaries[_name(dtype)] = _summary(gen, score)
        if config.vllm:
            rows += _vllm_rows(dtype, gen, score, summaries[_name(dtype)])
    if len(config.dtypes) > 1:
        rows += _best_rows(config, summaries)
    notes = [f"Medians of {config.repeats} alternating repetitions per dtype (generate: hf, tts, tts_ungrouped, "
             "hf, ...; score: hf, hf_full_head, tts, hf, ...), same process, dtypes "
             f"{', '.join(_name(d) for d in config.dtypes)} one after the other.",
             "HF generate: one left-padded batch, sampling T=0.8, min_new_tokens forces the full length "
             "(the equivalent of ignore_eos).",
             "Score: the judge PRM format on one MATH-500 question; 16 step sequences sampled by the "
             "generator; HF re-encodes every whole sequence each iteration (search-and-learn's way), left-padded "
             "so the scored position is the last column, and with logits_to_keep=1 computes the output layer "
             "only there; tts reuses cached prefixes and projects only the scored position onto the two "
             "candidate ids."]
    path = write_report("engine", "Engine benchmark: tts vs HF transformers", command,
                        {"dtypes": summaries}, rows, notes)
    return str(path)
