"""`tts bench tiered-kv`: the host KV tier (Seesaw) and prefix-aware ordering (FastTTS) on
a memory-squeezed beam search (issue 13, parts 1 and 4).

The workload is the memory sweep's thrashing setting (docs/benchmarks/memory.md): a small
device budget and a split that starves one model's KV pool, so prefix blocks are evicted
between the steps that reuse them. Four variants run the same problems with the same
seeds in alternating rounds (A, B, C, D, A, ...), medians reported: tier off/on crossed
with prefix-aware ordering off/on. Per variant: problems/s, tokens recomputed (thrash
recomputes x block size) and tokens the tier saved, host-tier hits, bytes swapped out and
in, swap seconds and the share hidden behind compute (GPU only), both models' prefix hit
rates (share of prompt tokens served from cache), and whether the predictions equal the
baseline's. A runtime is built per run from models loaded once; building it is untimed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from evals.bench import SideBySide, search_inputs, write_report
from memory.split import MemoryConfig
from search.config import SearchConfig
from search.driver import run_search
from search.problem import Problem
from tts_runtime.cohost.runtime import GENERATOR, PRM, Runtime
from tts_runtime.config import CacheConfig, EngineConfig, SchedulerConfig
from tts_runtime.models.loader import LoadedModel
from tts_runtime.models.registry import DEFAULT_GENERATOR, DEFAULT_PRM
from tts_runtime.options import comma_list, option

BASELINE = "tier off"
VARIANTS: dict[str, tuple[bool, bool]] = {  # label: (host tier, prefix-aware order)
    BASELINE: (False, False),
    "tier on": (True, False),
    "prefix order": (False, True),
    "tier on + prefix order": (True, True),
}


@dataclass
class TieredKVBench:
    config: SearchConfig
    memory: MemoryConfig  # the squeeze: a small device budget and a starving split
    host_kv_bytes: int
    limit: int = 4
    rounds: int = option(3, "Alternating rounds of the variants; medians.", at_least=1)
    prefetch: bool = True
    generator: str = DEFAULT_GENERATOR
    prm: str = DEFAULT_PRM
    dataset_path: str | None = None
    device: str = "auto"
    variants: tuple[str, ...] = option(default_factory=lambda: tuple(VARIANTS),
                                       help="Comma list of: tier off (always run: the baseline), tier on, prefix "
                                       "order, tier on + prefix order.", parse=comma_list(str, "variants"))


def _engine_config(bench: TieredKVBench, label: str) -> EngineConfig:
    tier, order = VARIANTS[label]
    return EngineConfig(device=bench.device, scheduler=SchedulerConfig(prefix_aware_order=order),
                        cache=CacheConfig(host_kv_bytes=bench.host_kv_bytes if tier else 0,
                                          host_kv_prefetch=bench.prefetch))


def _measure(bench: TieredKVBench, models: tuple[LoadedModel, LoadedModel], problems: Sequence[Problem],
             label: str) -> dict[str, Any]:
    runtime = Runtime(*models, memory=bench.memory, engine_config=_engine_config(bench, label))
    try:
        start = time.perf_counter()
        results = run_search(runtime, problems, bench.config)
        seconds = time.perf_counter() - start
        memory = runtime.memory_metrics()
        engines = {name: runtime.engines[name].stats for name in (GENERATOR, PRM)}
    finally:
        runtime.shutdown()
    block = runtime.engine_config.cache.block_size
    row: dict[str, Any] = {"seconds": seconds, "problems_per_s": len(results) / seconds,
                           "predictions": {r.id: r.prediction for r in results}}
    for name in (GENERATOR, PRM):
        host, stats = memory[name]["host_tier"], engines[name]
        row[f"{name}_thrash"] = memory[name]["thrash_events"]
        row[f"{name}_recomputed_tokens"] = memory[name]["thrash_events"] * block
        row[f"{name}_host_hits"] = host["hits"]
        row[f"{name}_tokens_saved"] = host["tokens_not_recomputed"]
        row[f"{name}_prefix_hit_rate"] = stats.cached_prompt_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
        for key in ("bytes_out", "bytes_in", "swap_seconds", "hidden_seconds"):
            row[f"{name}_{key}"] = host[key]
    row["computed_tokens"] = sum(stats.computed_tokens for stats in engines.values())
    return row


def bench_tiered_kv(bench: TieredKVBench, *, command: Sequence[str], log: Callable[[str], None]) -> Path:
    problems, device, models = search_inputs(bench, log)
    side = SideBySide("tiered-kv")

    def variant(label: str) -> Callable[[], dict]:
        def run() -> dict:
            row = _measure(bench, models, problems, label)
            log(f"  {label}: {row['problems_per_s']:.4f} problems/s ({row['seconds']:.0f} s), thrash "
                f"{row['generator_thrash']}/{row['prm_thrash']}, host hits "
                f"{row['generator_host_hits']}/{row['prm_host_hits']}")
            return row
        return run

    side.run({label: variant(label) for label in bench.variants}, bench.rounds)
    rows = [_row(side, label, len(problems)) for label in bench.variants]
    summary = {"problems": len(problems), "rounds": bench.rounds, "search": bench.config.to_dict(),
               "device": str(device), "torch_threads": torch.get_num_threads(),
               "device_memory": bench.memory.device_memory, "memory_split": bench.memory.prm_fraction,
               "host_kv_bytes_per_model": bench.host_kv_bytes, "prefetch": bench.prefetch,
               **{f"speedup {row['variant']}": row["speedup"] for row in rows if row["variant"] != BASELINE}}
    return write_report("tiered_kv", "Host KV tier and prefix-aware ordering on a memory-squeezed beam search",
                        " ".join(command), summary, rows, _notes(bench, len(problems), device))


def _row(side: SideBySide, label: str, problems: int) -> dict[str, Any]:
    runs, baseline = side.runs[label], side.runs[BASELINE]
    same = min(sum(run["predictions"][pid] == ref["predictions"][pid] for pid in ref["predictions"])
               for run, ref in zip(runs, baseline))
    median = lambda key: side.median(label, key)  # noqa: E731
    both = lambda key: median(f"{GENERATOR}_{key}") + median(f"{PRM}_{key}")  # noqa: E731
    swap = both("swap_seconds")
    return {"variant": label, "problems_per_s": median("problems_per_s"),
            "speedup": median("problems_per_s") / side.median(BASELINE, "problems_per_s"),
            "gen_prefix_hit": median(f"{GENERATOR}_prefix_hit_rate"), "prm_prefix_hit": median(f"{PRM}_prefix_hit_rate"),
            "thrash gen/prm": f"{median(f'{GENERATOR}_thrash'):.0f}/{median(f'{PRM}_thrash'):.0f}",
            "tokens_recomputed": both("recomputed_tokens"), "tokens_saved_by_tier": both("tokens_saved"),
            "host_hits": both("host_hits"), "MiB_out": both("bytes_out") / 2**20, "MiB_in": both("bytes_in") / 2**20,
            "swap_s": swap, "hidden_share": both("hidden_seconds") / swap if swap else 0.0,
            "computed_tokens": median("computed_tokens"), "same_predictions": f"{same}/{problems}",
            "problems_per_s_each_round": [round(run["problems_per_s"], 4) for run in runs]}


def _notes(bench: TieredKVBench, problems: int, device: torch.device) -> list[str]:
    config, memory = bench.config, bench.memory
    notes = [f"{problems} MATH-500 problems, beam search n={config.n} M={config.beam_width}, "
             f"{config.num_iterations} iterations, step cap {config.max_step_tokens} tokens, problem batch "
             f"{config.problem_batch}, eos sampling {'on' if config.eos_sampling else 'off'}, seed {config.resolved().seed}; "
             f"device budget {memory.device_memory / 2**30:.2f} GiB, PRM share of the KV {memory.prm_fraction} "
             f"(the memory sweep's thrashing setting); host tier {bench.host_kv_bytes / 2**20:.0f} MiB per model, "
             f"prefetch {'on' if bench.prefetch else 'off'}; {bench.rounds} alternating rounds, medians.",
             "tokens_recomputed = thrash events (lookups that missed a block computed before and evicted since) "
             "x block size; tokens_saved_by_tier = host-tier hits x block size (blocks swapped back in instead); "
             "prefix hits = share of prompt tokens served from the prefix cache, device or host tier.",
             "The machine may be shared with other work: ratios from alternating rounds, not absolute times, "
             "are the result."]
    if device.type == "cpu":
        notes.append("On CPU both tiers are DRAM: a swap is a memory copy, nothing runs beside it "
                     "(hidden_share is 0 by construction, prefetch copies run synchronously between steps), and "
                     "the tier's value is the tokens it keeps from being recomputed. On a GPU run the same command "
                     "with --device cuda: pinned host memory, copies on their own CUDA stream, prefetches behind "
                     "the forward, hidden_share measured from CUDA events.")
    return notes
