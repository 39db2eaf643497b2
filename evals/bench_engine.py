"""`tts bench engine`: the engine against HF transformers, side by side in one run.

(a) generate: 64 prompts x 128 new tokens, T=0.8, ignore EOS, the generator model;
    output tokens/s of tts vs HF `generate` at batch 64, same dtype.
(b) score: 16 beams x 8 steps sharing one question and their earlier steps, the PRM;
    tts with prefix caching vs an HF forward that re-encodes every whole sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evals.bench import SideBySide, write_report
from evals.datasets import load_problems
from search.prm import make_prm_format
from tts_runtime.config import EngineConfig
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import SamplingParams, ScoreParams
from tts_runtime.models.loader import LoadedModel, load_model


@dataclass(frozen=True)
class EngineBenchConfig:
    generator: str = "smollm2-135m-instruct"
    prm: str = "gemma3-270m"
    num_prompts: int = 64
    new_tokens: int = 128
    beams: int = 16
    steps: int = 8
    repeats: int = 3
    dtype: torch.dtype = torch.float32


def _generate_prompts(loaded: LoadedModel, count: int) -> list[list[int]]:
    problems = load_problems("math500", limit=count)
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


def bench_generate(config: EngineBenchConfig) -> SideBySide:
    from transformers import AutoModelForCausalLM

    loaded = load_model(config.generator, config.dtype, torch.device("cpu"))
    hf = AutoModelForCausalLM.from_pretrained(loaded.folder, dtype=config.dtype).eval()
    prompts = _generate_prompts(loaded, config.num_prompts)
    engine = Engine(config.generator, EngineConfig(), loaded=loaded)
    # The length-grouped decode attention switched off: what that optimisation is worth.
    ungrouped = Engine(config.generator, EngineConfig(group_decodes_by_length=False), loaded=loaded)
    for warm in (engine, ungrouped):
        _tts_generate(warm, prompts[:4], 4)
    side = SideBySide("generate")
    side.run({
        "hf": lambda: _hf_generate(hf, loaded.tokenizer, prompts, config.new_tokens),
        "tts": lambda: _tts_generate(engine, prompts, config.new_tokens),
        "tts_ungrouped": lambda: _tts_generate(ungrouped, prompts, config.new_tokens),
    }, config.repeats)
    return side


def _beam_steps(config: EngineBenchConfig) -> tuple[str, list[list[str]]]:
    """One real question and `beams` diverging step sequences sampled by the generator."""
    problem = load_problems("math500", limit=1)[0]
    loaded = load_model(config.generator, config.dtype, torch.device("cpu"))
    engine = Engine(config.generator, EngineConfig(), loaded=loaded)
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


def _tts_score(prm: LoadedModel, queries) -> dict:
    engine = Engine(prm.name, EngineConfig(), loaded=prm)
    for per_iteration in queries:  # iteration by iteration, like beam search
        engine.score([q.token_ids for q in per_iteration], [q.score_params() for q in per_iteration])
    return {"computed_tokens": engine.stats.computed_tokens}


def _hf_score(hf, queries, pad: int) -> dict:
    computed = 0
    for per_iteration in queries:
        width = max(len(q.token_ids) for q in per_iteration)
        ids = torch.tensor([q.token_ids + [pad] * (width - len(q.token_ids)) for q in per_iteration])
        mask = torch.tensor([[1] * len(q.token_ids) + [0] * (width - len(q.token_ids)) for q in per_iteration])
        with torch.inference_mode():
            hf(input_ids=ids, attention_mask=mask)
        computed += sum(len(q.token_ids) for q in per_iteration)
    return {"computed_tokens": computed}


def bench_score(config: EngineBenchConfig) -> SideBySide:
    from transformers import AutoModelForCausalLM

    question, beams = _beam_steps(config)
    prm = load_model(config.prm, config.dtype, torch.device("cpu"))
    hf = AutoModelForCausalLM.from_pretrained(prm.folder, dtype=config.dtype).eval()
    queries = _score_queries(prm, question, beams, config.steps)
    pad = prm.tokenizer.pad_token_id or 0
    side = SideBySide("score")
    side.run({"hf": lambda: _hf_score(hf, queries, pad), "tts": lambda: _tts_score(prm, queries)}, config.repeats)
    return side


def run_engine_bench(config: EngineBenchConfig, command: str) -> str:
    gen = bench_generate(config)
    score = bench_score(config)
    gen_rates = {k: gen.median(k, "tokens") / gen.median(k, "seconds") for k in ("hf", "tts", "tts_ungrouped")}
    score_time = {k: score.median(k, "seconds") for k in ("hf", "tts")}
    score_tokens = {k: score.median(k, "computed_tokens") for k in ("hf", "tts")}
    rows = [
        {"workload": f"generate {config.num_prompts}x{config.new_tokens} ({config.generator})",
         "hf": f"{gen_rates['hf']:.1f} tok/s", "tts": f"{gen_rates['tts']:.1f} tok/s",
         "ratio": f"{gen_rates['tts'] / gen_rates['hf']:.2f}x", "target": ">= 2.5x"},
        {"workload": "generate, tts without length-grouped decode attention",
         "hf": f"{gen_rates['hf']:.1f} tok/s", "tts": f"{gen_rates['tts_ungrouped']:.1f} tok/s",
         "ratio": f"{gen_rates['tts_ungrouped'] / gen_rates['hf']:.2f}x", "target": "(switch off)"},
        {"workload": f"score {config.beams} beams x {config.steps} steps ({config.prm}) wall time",
         "hf": f"{score_time['hf']:.2f} s", "tts": f"{score_time['tts']:.2f} s",
         "ratio": f"{score_time['hf'] / score_time['tts']:.2f}x less", "target": ">= 2x"},
        {"workload": "score computed tokens",
         "hf": f"{score_tokens['hf']:.0f}", "tts": f"{score_tokens['tts']:.0f}",
         "ratio": f"{score_tokens['hf'] / score_tokens['tts']:.2f}x fewer", "target": ">= 3x"},
    ]
    summary = {"generate_tokens_per_s": gen_rates, "generate_ratio": gen_rates["tts"] / gen_rates["hf"],
               "score_seconds": score_time, "score_time_ratio": score_time["hf"] / score_time["tts"],
               "score_computed_tokens": score_tokens,
               "score_token_ratio": score_tokens["hf"] / score_tokens["tts"],
               "raw": {"generate": gen.runs, "score": score.runs}}
    notes = [f"Medians of {config.repeats} alternating repetitions (hf, tts, tts_ungrouped, hf, ...), same process, "
             f"dtype {str(config.dtype).removeprefix('torch.')}.",
             "HF generate: one left-padded batch, sampling T=0.8, min_new_tokens forces the full length "
             "(the equivalent of ignore_eos).",
             "Score: the judge PRM format on one MATH-500 question; 16 step sequences sampled by the "
             "generator; HF re-encodes every whole sequence each iteration (search-and-learn's way)."]
    path = write_report("engine", "Engine benchmark: tts vs HF transformers", command, summary, rows, notes)
    return str(path)
