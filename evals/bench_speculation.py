"""`tts bench speculation`: FastTTS's speculative beam extension off vs on, side by side on
one beam-search workload (issue 13 part 4).

Both variants run the same problems, settings and seeds in alternating rounds (off, on,
off, on ...; medians). A runtime is built for each run from models loaded once (outside
the timing), so neither variant starts with the other's prefix cache. Reported: problems/min,
goodput (tokens the search used per second: speculative tokens that were discarded do not
count), the generator's raw rate (every token it sampled), speculative tokens generated,
kept and discarded, and whether every prediction equals the off run's. Writes
docs/benchmarks/speculation.json and .md (relative to the working directory).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from evals.bench import SideBySide, search_inputs, write_report
from memory.split import MemoryConfig
from search.config import SearchConfig
from search.driver import run_search
from search.problem import Problem
from tts_runtime.cohost.runtime import Runtime
from tts_runtime.config import EngineConfig
from tts_runtime.models.loader import LoadedModel
from tts_runtime.models.registry import DEFAULT_GENERATOR, DEFAULT_PRM
from tts_runtime.options import option

OFF, ON = "off", "on"


@dataclass
class SpeculationBench:
    config: SearchConfig  # speculative_extension is set per variant; speculative_max_tokens is kept
    limit: int = 20
    rounds: int = option(2, "Alternating rounds (off, on); medians.", at_least=1)
    generator: str = DEFAULT_GENERATOR
    prm: str = DEFAULT_PRM
    dataset_path: str | None = None
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    device: str = "auto"


def _measure(bench: SpeculationBench, models: tuple[LoadedModel, LoadedModel], problems: Sequence[Problem],
             config: SearchConfig) -> dict[str, Any]:
    runtime = Runtime(*models, memory=bench.memory, engine_config=EngineConfig(device=bench.device))
    try:
        before = runtime.generator.stats.generated_tokens
        start = time.perf_counter()
        results = run_search(runtime, problems, config)
        seconds = time.perf_counter() - start
        sampled = runtime.generator.stats.generated_tokens - before
    finally:
        runtime.shutdown()
    useful = sum(r.generated_tokens for r in results)
    return {"seconds": seconds, "problems_per_min": 60 * len(results) / seconds,
            "goodput_tokens_per_s": useful / seconds, "generator_tokens_per_s": sampled / seconds,
            "useful_tokens": useful, "sampled_tokens": sampled,
            "speculative_tokens": sum(r.speculative_tokens for r in results),
            "speculative_kept_tokens": sum(r.speculative_kept_tokens for r in results),
            "speculative_discarded_tokens": sum(r.speculative_discarded_tokens for r in results),
            "predictions": {r.id: r.prediction for r in results}}


def bench_speculation(bench: SpeculationBench, *, command: Sequence[str], log: Callable[[str], None]) -> Path:
    problems, device, models = search_inputs(bench, log)
    side = SideBySide("speculation")

    def variant(label: str) -> Callable[[], dict]:
        config = replace(bench.config, speculative_extension=label == ON)

        def run() -> dict:
            row = _measure(bench, models, problems, config)
            log(f"  speculation {label}: {row['problems_per_min']:.2f} problems/min ({row['seconds']:.0f} s), "
                f"goodput {row['goodput_tokens_per_s']:.1f} tok/s, speculative kept "
                f"{row['speculative_kept_tokens']} discarded {row['speculative_discarded_tokens']}")
            return row
        return run

    side.run({label: variant(label) for label in (OFF, ON)}, bench.rounds)
    rows = [_row(side, label, len(problems)) for label in (OFF, ON)]
    config = bench.config
    summary = {"problems": len(problems), "rounds": bench.rounds, "search": config.to_dict(),
               "device": str(device), "torch_threads": torch.get_num_threads(),
               "speedup problems/min": rows[1]["speedup"],
               "goodput ratio": rows[1]["goodput_tokens_per_s"] / rows[0]["goodput_tokens_per_s"]}
    cap = config.speculative_max_tokens
    notes = [f"{len(problems)} MATH-500 problems, beam search n={config.n} M={config.beam_width}, "
             f"{config.num_iterations} iterations, step cap {config.max_step_tokens} tokens, last-iteration cap "
             f"{config.max_tokens}, problem batch {config.problem_batch}, T={config.temperature}, seed {config.seed}; "
             f"speculative step cap {cap if cap is not None else 'none (the step cap)'}; "
             f"{bench.rounds} alternating rounds, medians.",
             "goodput = tokens the search used (ProblemResult.generated_tokens, the same with speculation on or "
             "off) per second; generator tok/s = every token the generator sampled, discarded speculation "
             "included. kept + discarded = speculative tokens (per run, median over rounds).",
             "With speculation on the search makes the same decisions (tests/search/test_speculation.py); the "
             "same-prediction column checks it on this workload.",
             "The machine may be shared with other work: ratios from alternating rounds, not absolute times, "
             "are the result."]
    return write_report("speculation", "Speculative beam extension (FastTTS): off vs on",
                        " ".join(command), summary, rows, notes)


def _row(side: SideBySide, label: str, problems: int) -> dict[str, Any]:
    runs, baseline = side.runs[label], side.runs[OFF]
    same = min(sum(run["predictions"][pid] == ref["predictions"][pid] for pid in ref["predictions"])
               for run, ref in zip(runs, baseline))
    median = side.median
    generated = median(label, "speculative_tokens")
    return {"speculation": label, "problems_per_min": median(label, "problems_per_min"),
            "speedup": median(label, "problems_per_min") / median(OFF, "problems_per_min"),
            "goodput_tokens_per_s": median(label, "goodput_tokens_per_s"),
            "generator_tokens_per_s": median(label, "generator_tokens_per_s"),
            "speculative_tokens": generated,
            "kept": median(label, "speculative_kept_tokens"),
            "discarded": median(label, "speculative_discarded_tokens"),
            "kept_share": median(label, "speculative_kept_tokens") / generated if generated else 0.0,
            "same_prediction_as_off": f"{same}/{problems}",
            "problems_per_min_each_round": [round(run["problems_per_min"], 3) for run in runs]}
