"""`tts bench cohost`: how the co-hosted pair is driven, side by side on one beam-search
workload (issue 13 parts 2-4).

Variants: today's alternation (each engine every runtime step), batched phases (Seesaw's
transition-minimising rule), overlapped forwards (a worker process per engine on CPU, a
CUDA stream each on a GPU), both, FastTTS's speculative beam extension and prefix-aware
ordering each on its own, and all of them together. (The host KV tier is measured on a
memory-squeezed run of its own, `tts bench tiered-kv`: on CPU its copies are made in the
driver's process, so it does not combine with overlap's worker processes.) Every variant
runs the same problems with the same seeds, in alternating rounds (A, B, C, D, A, B ...),
medians reported: problems/min, goodput (tokens the search used per second), each engine's
mean batch (sequences per forward), phase transitions, each engine's busy fraction (time
with a forward in flight over the search's wall time), and whether the predictions equal
the alternating baseline's. A runtime is built for each run (overlap needs its own worker
processes) from models loaded once; building it is outside the timing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from evals.bench import SideBySide, search_inputs, write_report
from memory.split import MemoryConfig
from search.config import SearchConfig
from search.driver import run_search
from search.problem import Problem
from tts_runtime.cohost.overlap import worker_threads
from tts_runtime.cohost.runtime import Runtime, device_total
from tts_runtime.config import CacheConfig, CohostConfig, EngineConfig, SchedulerConfig
from tts_runtime.engine.forward_costs import widest_forward_seconds
from tts_runtime.models.loader import LoadedModel
from tts_runtime.runs.metrics import EngineCounters, speculation
from tts_runtime.models.registry import DEFAULT_GENERATOR, DEFAULT_PRM
from tts_runtime.options import comma_list, option

BASELINE = "alternate"


@dataclass(frozen=True)
class Variant:
    """A variant's switches over the baseline."""

    cohost: dict[str, Any] = field(default_factory=dict)  # CohostConfig fields
    speculation: bool = False  # SearchConfig.speculative_extension
    prefix_order: bool = False  # SchedulerConfig.prefix_aware_order
    score_graphs: bool = True  # EngineConfig.score_graphs (CUDA only)
    executor_sampling: bool = False  # EngineConfig.executor_sampling
    partial_blocks: bool = True  # CacheConfig.reuse_partial_blocks


_ALL = Variant({"phase_policy": "batched", "overlap": True}, speculation=True, prefix_order=True)
VARIANTS: dict[str, Variant] = {
    BASELINE: Variant(),
    "batched": Variant({"phase_policy": "batched"}),
    "overlap": Variant({"overlap": True}),
    "batched + overlap": Variant({"phase_policy": "batched", "overlap": True}),
    "speculation": Variant(speculation=True),
    "prefix order": Variant(prefix_order=True),
    "batched + prefix order": Variant({"phase_policy": "batched"}, prefix_order=True),
    "all": _ALL,
    "eager scores": Variant(score_graphs=False),
    "executor sampling": Variant(executor_sampling=True),
    "hide driver": Variant({"hide_driver": True}),
    # What hides the host on the simulated H100 (docs/benchmarks/host_targets.md), less
    # overlap, which executor sampling excludes: async scheduling needs executor sampling on CUDA.
    "batched + executor sampling + hide driver": Variant({"phase_policy": "batched", "hide_driver": True},
                                                         executor_sampling=True),
    "no partial blocks": Variant(partial_blocks=False),
}


@dataclass
class CohostBench:
    config: SearchConfig
    limit: int = 20
    rounds: int = option(2, "Alternating rounds of every variant; medians.", at_least=1)
    generator: str = DEFAULT_GENERATOR
    prm: str = DEFAULT_PRM
    dataset_path: str | None = None
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    device: str = "auto"
    dtype: str = "auto"  # both models, every variant (tts_runtime.config.resolve_dtype)
    linear_backend: str = "auto"  # EngineConfig.linear_backend, every variant
    thresholds: CohostConfig = field(default_factory=CohostConfig)  # the batched variants' buffers
    variants: tuple[str, ...] = option(tuple(VARIANTS), "Comma-separated, alternate (the baseline) first: "
                                       f"{', '.join(VARIANTS)}.", parse=comma_list(str, "variants"))


def _measure(bench: CohostBench, models: tuple[LoadedModel, LoadedModel], problems: Sequence[Problem],
             cohost: CohostConfig, variant: Variant) -> dict[str, Any]:
    engine_config = EngineConfig(device=bench.device, cohost=cohost, linear_backend=bench.linear_backend,
                                 cache=CacheConfig(reuse_partial_blocks=variant.partial_blocks),
                                 scheduler=SchedulerConfig(prefix_aware_order=variant.prefix_order),
                                 score_graphs=variant.score_graphs, executor_sampling=variant.executor_sampling)
    config = replace(bench.config, speculative_extension=variant.speculation)
    runtime = Runtime(*models, memory=bench.memory, engine_config=engine_config)
    try:
        before = runtime.cohost_counters()
        engines_before = {name: EngineCounters.read(engine) for name, engine in runtime.engines.items()}
        start = time.perf_counter()
        results = run_search(runtime, problems, config)
        seconds = time.perf_counter() - start
        counters = runtime.cohost_counters() - before
        report = counters.report(seconds, cohost)
        hit_rates = {name: (EngineCounters.read(engine) - engines_before[name]).prefix_hit_rate
                     for name, engine in runtime.engines.items()}
    finally:
        runtime.shutdown()
    gen, prm = report["generator"], report["prm"]
    spec = speculation(results, seconds)
    # Every beam in flight in one forward, within the engine's token budget.
    widest = {name: widest_forward_seconds(engine.forward_costs, config.n * config.problem_batch,
                                           engine_config.scheduler.max_num_batched_tokens)
              for name, engine in (("generator", counters.generator), ("prm", counters.prm))}
    costs = {name: asdict(fit) if (fit := engine.forward_costs.fit()) else None
             for name, engine in (("generator", counters.generator), ("prm", counters.prm))}
    return {"seconds": seconds, "problems_per_min": 60 * len(results) / seconds,
            "goodput": spec["goodput_tokens_per_s"], "speculative_kept": spec["kept_tokens"],
            "speculative_discarded": spec["discarded_tokens"],
            "generator_hit_rate": hit_rates["generator"], "prm_hit_rate": hit_rates["prm"],
            "generator_batch": gen["mean_batch_seqs"], "prm_batch": prm["mean_batch_seqs"],
            "prm_batch_tokens": prm["mean_batch_tokens"], "generator_forwards": gen["forwards"],
            "prm_forwards": prm["forwards"], "transitions": report["phase_transitions"],
            "device_busy": report["busy_fraction"],
            "generator_busy": gen["busy_fraction"], "prm_busy": prm["busy_fraction"],
            "busy_if_widest": sum(part or 0.0 for part in widest.values()) / seconds,
            "forward_costs": costs, "prm_fixed_ms": costs["prm"]["fixed_seconds"] * 1e3 if costs["prm"] else float("nan"),
            "predictions": {r.id: r.prediction for r in results}}


def bench_cohost(bench: CohostBench, *, command: Sequence[str], log: Callable[[str], None]) -> Path:
    problems, device, models = search_inputs(bench, log, bench.dtype)
    dtype = str(models[0].dtype).removeprefix("torch.")
    side = SideBySide("cohost")

    def variant(label: str) -> Callable[[], dict]:
        # Each variant names its policy: the default, auto, would differ between CPU and GPU.
        cohost = CohostConfig(**{**vars(bench.thresholds), "phase_policy": "alternate", **VARIANTS[label].cohost})

        def run() -> dict:
            row = _measure(bench, models, problems, cohost, VARIANTS[label])
            log(f"  {label}: {row['problems_per_min']:.2f} problems/min ({row['seconds']:.0f} s), "
                f"{row['transitions']} transitions, busy generator {row['generator_busy']:.0%} "
                f"PRM {row['prm_busy']:.0%}")
            return row
        return run

    side.run({label: variant(label) for label in bench.variants}, bench.rounds)
    rows = [_row(side, label, len(problems), device) for label in bench.variants]
    ceilings = speedup_ceilings({row["variant"]: row for row in rows}, cores_split=device.type == "cpu")
    fits = side.runs[BASELINE][0]["forward_costs"]
    total = device_total(str(device))  # for `--device sim:REPORT`, a simulated device of this card's memory
    summary = {"problems": len(problems), "rounds": bench.rounds, "search": bench.config.to_dict(),
               "thresholds": vars(bench.thresholds), "device": str(device),
               "torch_threads": torch.get_num_threads(), "dtype": dtype,
               "linear_backend": bench.linear_backend, "ceilings": ceilings,
               "alternate_forward_costs": fits if total is None else {**fits, "device_memory": total},
               **{f"speedup {row['variant']}": row["speedup"] for row in rows if row["variant"] != BASELINE}}
    config = bench.config
    notes = [f"{len(problems)} MATH-500 problems, beam search n={config.n} M={config.beam_width}, "
             f"{config.num_iterations} iterations, step cap {config.max_step_tokens} tokens, last-iteration cap "
             f"{config.max_tokens}, problem batch {config.problem_batch}, T={config.temperature}, seed {config.resolved().seed}, "
             f"both models in {dtype}, linear backend "
             f"{bench.linear_backend}; "
             f"{bench.rounds} alternating rounds, medians.",
             "goodput = tokens of the finished solutions per second (discarded speculation is not counted); "
             "hit rate = share of each engine's prompt tokens served from its prefix cache.",
             "prm_fixed_ms = the fixed part of the PRM's forward cost fitted on that run (launch to result); "
             "eager scores = the PRM's score forwards without CUDA graphs (on a CPU it is the same path as "
             "alternate); executor sampling = the executor samples on the device, so async scheduling launches "
             "the generator's next decode before this one's tokens reach the host (on a CPU it overlaps nothing); "
             "no partial blocks = every continued beam and forked child recomputes its partial last KV block "
             "(`--no-partial-blocks`); hide driver = each step's forwards launch before the search logic of the "
             "step before runs (`--hide-driver`).",
             "batch = sequences per forward (mean); transitions = forwards of the other engine than the one "
             "before; busy = time with a forward of that engine in flight (launch to result) over the "
             "search's wall time (overlapped engines can both be near 100%); device_busy = time with a forward "
             "of either engine in flight, counted once where both are (issue 35's device-busy target on a GPU).",
             "overlap on CPU: a worker process per engine, each with half the cores; without overlap one "
             "process runs both models on all cores (the threads column). On a loaded machine a 2-thread "
             "process can lose much more to oversubscription than two 1-thread ones, which flatters overlap "
             "beyond what running the engines at once gives: compare on an idle machine. With batched "
             "phases and overlap the generator decodes in every step; the phases only batch the PRM's launches.",
             f"Batched-phase thresholds: PRM buffer {bench.thresholds.prm_buffer_tokens} tokens, generator low "
             f"water {bench.thresholds.generator_low_water}, generator buffer "
             f"{bench.thresholds.generator_buffer_seqs} sequences.",
             "The machine may be shared with other work: ratios from alternating rounds, not absolute times, "
             "are the result.", *_ceiling_notes(ceilings), _forward_cost_note(fits)]
    return write_report("cohost", "Co-hosting the pair: phase policy and overlapped generator + PRM",
                        " ".join(command), summary, rows, notes)


def speedup_ceilings(rows: dict[str, dict[str, Any]], cores_split: bool) -> dict[str, float]:
    """Upper bounds on what scheduling the same forwards can gain, from measured busy fractions.

    `one_process`: the engines' forwards run one after the other, so a policy that leaves
    their work unchanged cannot finish faster than the alternating run's forwards took.
    `widest_forwards` lets the policy change the forwards too: the alternating run's decodes
    and prefill tokens, each engine's in forwards as wide as the search allows (every beam
    in flight, within the token budget), each forward costing what the fit of that engine's
    forwards in the run says (engine/forward_costs.py), the time outside forwards unchanged.
    It is an estimate from a linear cost model, not a hard bound, and an optimistic one: a
    beam search's steps end at different lengths, so no schedule keeps every beam in one batch.
    With the overlap variant's busy fractions (each engine alone on its worker's threads):
    `overlap`, the run cannot be shorter than the slower engine's forwards; and where the
    workers split the cores between them (`cores_split`, CPU), `any_schedule`: it cannot be
    shorter than both engines' forwards packed perfectly onto the workers side by side (a
    forward on fewer threads uses each thread at least as well). (CUDA streams share the
    whole device, so no such packing bound holds there.) Busy intervals include transfers,
    so the overlapped bounds are slight underestimates."""
    base = rows[BASELINE]
    busy = base["generator_busy"] + base["prm_busy"]
    ceilings = {"one_process": 1 / busy, "widest_forwards": 1 / (1 - busy + base["busy_if_widest"])}
    if "overlap" in rows:
        overlap = rows["overlap"]
        busy = (overlap["generator_busy"], overlap["prm_busy"])
        ceilings["overlap"] = overlap["speedup"] / max(busy)
        if cores_split:
            ceilings["any_schedule"] = overlap["speedup"] * len(busy) / sum(busy)
    return ceilings


def _ceiling_notes(ceilings: dict[str, float]) -> list[str]:
    notes = [f"Ceiling in one process: {ceilings['one_process']:.2f}x. The alternating run's forwards fill "
             f"{1 / ceilings['one_process']:.0%} of its time, so phases, speculation and ordering can gain "
             "more only by making the forwards themselves cheaper (bigger batches, fewer tokens recomputed)."]
    notes.append(f"Ceiling with the widest forwards: {ceilings['widest_forwards']:.2f}x: the alternating run's "
                 "tokens, every beam in flight in one forward (within the token budget), each forward costing "
                 "what a least-squares fit of the engine's forwards in that run gives (fixed + per decode + per "
                 "prefill token); busy_if_widest is that time's share of each run.")
    if "overlap" in ceilings:
        notes.append(f"Ceiling overlapped: {ceilings['overlap']:.2f}x with each engine on its own worker (the "
                     "slower engine's forwards bound the run).")
    if "any_schedule" in ceilings:
        notes.append(f"Ceiling of any schedule of the same forwards on these cores: {ceilings['any_schedule']:.2f}x "
                     "(both engines' one-worker forward time packed perfectly side by side).")
    return notes


def _forward_cost_note(costs: dict[str, dict | None]) -> str:
    parts = [f"{name} {cost['fixed_seconds'] * 1e3:.1f} ms + {cost['seconds_per_decode'] * 1e3:.2f} ms per decode "
             f"+ {cost['seconds_per_prefill_token'] * 1e3:.3f} ms per prefill token"
             for name, cost in costs.items() if cost is not None]
    return "Forward cost fitted on the first alternating round: " + "; ".join(parts) + "."


def _row(side: SideBySide, label: str, problems: int, device: torch.device) -> dict[str, Any]:
    runs, baseline = side.runs[label], side.runs[BASELINE]
    same = min(sum(run["predictions"][pid] == ref["predictions"][pid] for pid in ref["predictions"])
               for run, ref in zip(runs, baseline))
    median = side.median
    overlap = VARIANTS[label].cohost.get("overlap")
    if device.type == "cuda":
        threads = "one process, a CUDA stream per engine" if overlap else "one process"
    else:
        threads = (f"{worker_threads(EngineConfig())} per worker" if overlap
                   else f"{torch.get_num_threads()} in one process")
    return {"variant": label, "threads": threads, "problems_per_min": median(label, "problems_per_min"),
            "speedup": median(label, "problems_per_min") / median(BASELINE, "problems_per_min"),
            "goodput_tokens_per_s": median(label, "goodput"),
            "speculative_kept": median(label, "speculative_kept"),
            "speculative_discarded": median(label, "speculative_discarded"),
            "generator_hit_rate": median(label, "generator_hit_rate"), "prm_hit_rate": median(label, "prm_hit_rate"),
            "generator_batch": median(label, "generator_batch"), "prm_batch": median(label, "prm_batch"),
            "prm_batch_tokens": median(label, "prm_batch_tokens"),
            "transitions": median(label, "transitions"),
            "device_busy": median(label, "device_busy"),
            "generator_busy": median(label, "generator_busy"), "prm_busy": median(label, "prm_busy"),
            "busy_if_widest": median(label, "busy_if_widest"),
            "prm_fixed_ms": median(label, "prm_fixed_ms"),
            "same_prediction_as_alternate": f"{same}/{problems}",
            "problems_per_min_each_round": [round(run["problems_per_min"], 3) for run in runs]}
