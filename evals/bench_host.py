"""Host benchmark: how much of the main job the host (not the device) takes, on the simulated
H100 (`--device sim`, executor/sim.py).

Beam search with search-and-learn's settings (search/config.py: n=4, M=4, 40 iterations,
2048-token steps) on the first K MATH-500 problems at problem batch B, the H100 run's memory
plan (85.5 GB, the default static split) and phase policy (batched). Reports per configuration:
problems/min; the ceiling (every forward back to back: the sum of the simulated forwards'
costs); the device's and each engine's busy fraction; host milliseconds per engine step by
phase (engine/host_times.py); and outside the engines, the runtime's own stepping, the search
driver (asyncio, search logic, score cache, results) and grading. Writes host.json and host.md.

    python -m evals.bench_host --limits 20 100 --problem-batches 16 64
    python -m evals.bench_host --limits 20 --problem-batches 16 64 --async-scheduling both \
        --hide-driver both --rounds 3 --stem host_async
    python -m evals.bench_host --limits 20 --problem-batches 16 64 --overlap on --hide-driver on \
        --partial-blocks both --rounds 2 --stem host_partial_blocks
    python -m evals.bench_host --limits 20 --problem-batches 16 64 --overlap on --hide-driver on \
        --generator-low-water 0 4 --rounds 3 --stem host_low_water
    python -m evals.bench_host --limits 20 --problem-batches 16 64 --overlap on --hide-driver on \
        --freeze-heap both --rounds 3 --stem host_gc_freeze
"""

from __future__ import annotations

import argparse
import gc
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import math_verify.grader
import math_verify.parser

import search.driver
import search.grading
import search.qwen_grader
from evals.bench import SideBySide, write_report
from memory.split import MemoryConfig
from search.config import SearchConfig
from search.driver import run_search
from search.problem import Problem
from tts_runtime.cohost.runtime import Runtime
from tts_runtime.config import (CacheConfig, CohostConfig, EngineConfig, SchedulerConfig, resolve_device,
                                resolve_dtype)
from tts_runtime.engine.host_times import PHASES
from tts_runtime.executor.sim import shared_device
from tts_runtime.executor.sim_costs import H100_MEMORY
from tts_runtime.models.loader import LoadedModel, load_model
from tts_runtime.runs.datasets import DatasetConfig, load_problems
from tts_runtime.models.registry import DEFAULT_GENERATOR, DEFAULT_PRM
from tts_runtime.options import comma_list, option


@dataclass
class HostBench:
    limits: tuple[int, ...] = option((20, 100), "Comma-separated MATH-500 problem counts.",
                                     parse=comma_list(int, "limits"))
    problem_batches: tuple[int, ...] = option((16, 64), "Comma-separated problem batches.",
                                              parse=comma_list(int, "problem-batches"))
    device: str = "sim"
    generator: str = DEFAULT_GENERATOR
    prm: str = DEFAULT_PRM
    config: SearchConfig = field(default_factory=SearchConfig)
    # The H100 run's plan: the default static split.
    memory: MemoryConfig = field(default_factory=lambda: MemoryConfig(device_memory=H100_MEMORY))
    phase_policy: str = "batched"
    # Variants run side by side, alternating, `rounds` times: the driver hidden behind the
    # forwards (CohostConfig.hide_driver) off and/or on, async scheduling
    # (SchedulerConfig.async_scheduling) off and/or on, every combination.
    hide_driver: Sequence[bool] = (False,)
    # Both engines' forwards queued on the device's one stream (CohostConfig.overlap) off and/or on.
    overlap: Sequence[bool] = (False,)
    async_scheduling: Sequence[bool] = (True,)  # the engine's default
    # Partial KV blocks kept for the requests that continue them (CacheConfig.reuse_partial_blocks).
    partial_blocks: Sequence[bool] = (True,)  # the engine's default
    # The batched policy's switch to the PRM at this few unfinished generator sequences
    # (CohostConfig.generator_low_water), one variant per value.
    generator_low_water: Sequence[int] = (CohostConfig().generator_low_water,)  # the default
    # The heap frozen while the search runs (CohostConfig.freeze_heap) off and/or on.
    freeze_heap: Sequence[bool] = (CohostConfig().freeze_heap,)  # the default
    rounds: int = 1
    dataset_path: str | None = None
    stem: str = "host"


class _Timed:
    """Seconds spent inside a callable, counted by a wrapper around it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def wrap(self, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1
        return timed


class _GcPauses:
    """Python's garbage collections during a run: count, seconds, longest pause, and how many
    were full (generation 2) collections."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))

    def summary(self) -> dict[str, Any]:
        full = [seconds for generation, seconds in self.pauses if generation == 2]
        return {"gc_collections": len(self.pauses), "gc_seconds": sum(seconds for _, seconds in self.pauses),
                "gc_full_collections": len(full), "gc_longest_pause_s": max((s for _, s in self.pauses), default=0.0)}


@contextmanager
def _gc_pauses(pauses: _GcPauses):
    gc.callbacks.append(pauses)
    try:
        yield
    finally:
        gc.callbacks.remove(pauses)


@contextmanager
def _timed_grading(timer: _Timed):
    """Grading is `summarize` (answer extraction, votes, grades) at each problem's end. Its
    memos start empty, as in a real run: a variant run after another would find every answer."""
    for module in (search.grading, search.qwen_grader, math_verify.parser, math_verify.grader):
        for memoised in vars(module).values():
            if hasattr(memoised, "cache_clear"):
                memoised.cache_clear()
    original = search.driver.summarize
    search.driver.summarize = timer.wrap(original)
    try:
        yield
    finally:
        search.driver.summarize = original


def _warm_grader(problems: Sequence[Problem]) -> None:
    """Parse every reference answer once before the measured runs. math-verify's LaTeX parser
    (ANTLR) builds its prediction tables lazily, once per process: without this the first run
    grades 3x slower than the rest (0.53 vs 0.16 s for 20 problems; 0.36 vs 0.12 s for the
    graded answers alone, every memo cleared) and whichever variant runs first pays for it.
    The memos are still cleared before each run (`_timed_grading`)."""
    for problem in problems:
        search.grading.canonical_answer(problem.answer)


def _search_config(bench: HostBench, problem_batch: int) -> SearchConfig:
    return SearchConfig(**{**bench.config.to_dict(), "problem_batch": problem_batch})


def measure(bench: HostBench, models: tuple[LoadedModel, LoadedModel], problems: Sequence[Problem],
            problem_batch: int, hide_driver: bool, overlap: bool, async_scheduling: bool,
            partial_blocks: bool, low_water: int, freeze_heap: bool) -> dict[str, Any]:
    """One run on a fresh runtime (a cold prefix cache, as in a real run)."""
    cohost = CohostConfig(phase_policy=bench.phase_policy, hide_driver=hide_driver, overlap=overlap,
                          generator_low_water=low_water, freeze_heap=freeze_heap)
    engine_config = EngineConfig(device=bench.device, cohost=cohost,
                                 cache=CacheConfig(reuse_partial_blocks=partial_blocks),
                                 scheduler=SchedulerConfig(async_scheduling=async_scheduling))
    runtime = Runtime(*models, memory=bench.memory, engine_config=engine_config)
    config = _search_config(bench, problem_batch)
    device = shared_device(bench.device)
    stepping, grading, pauses = _Timed(), _Timed(), _GcPauses()
    # The parts of a runtime step (hide_driver calls them apart, `step` calls them all).
    runtime.choose_step = stepping.wrap(runtime.choose_step)
    runtime.begin_step = stepping.wrap(runtime.begin_step)
    runtime.finish_step = stepping.wrap(runtime.finish_step)
    before = {name: (engine.host_times.copy(), engine.busy.seconds, engine.stats.steps,
                     engine.stats.computed_tokens, sum(engine.stats.decode_batch_sizes))
              for name, engine in runtime.engines.items()}
    device_before = device.busy_seconds
    try:
        with _timed_grading(grading), _gc_pauses(pauses):
            start = time.perf_counter()
            results = run_search(runtime, problems, config)
            wall = time.perf_counter() - start
    finally:
        runtime.shutdown()
    ceiling = device.busy_seconds - device_before
    engines, in_engines = {}, 0.0
    for name, engine in runtime.engines.items():
        times, busy, steps, computed, decodes = before[name]
        phases = (engine.host_times - times).seconds
        steps = engine.stats.steps - steps
        total = sum(v for k, v in phases.items() if k != "detokenize")
        in_engines += total
        engines[name] = {
            "steps": steps, "busy_fraction": (engine.busy.seconds - busy) / wall,
            "decode_tokens": (decoded := sum(engine.stats.decode_batch_sizes) - decodes),
            "prefill_tokens": engine.stats.computed_tokens - computed - decoded,
            "seconds": total, "host_seconds": total - phases["wait"],
            **{f"{phase}_ms_per_step": 1e3 * phases[phase] / max(steps, 1) for phase in PHASES},
        }
    driver = wall - stepping.seconds - grading.seconds
    return {
        "problems": len(results), "problem_batch": problem_batch, "hide_driver": hide_driver, "overlap": overlap,
        "async_scheduling": async_scheduling, "partial_blocks": partial_blocks, "low_water": low_water,
        "freeze_heap": freeze_heap, "seconds": wall,
        "problems_per_min": 60 * len(results) / wall,
        "ceiling_problems_per_min": 60 * len(results) / ceiling if ceiling else 0.0,
        "device_seconds": ceiling, "device_busy_fraction": ceiling / wall,
        "runtime_steps": stepping.calls // 3,
        "runtime_other_seconds": stepping.seconds - in_engines,
        "search_driver_seconds": driver, "grading_seconds": grading.seconds,
        "engines": engines,
        **pauses.summary(),
    }


def _row(m: dict[str, Any]) -> dict[str, Any]:
    gen, prm = m["engines"]["generator"], m["engines"]["prm"]
    wall = m["seconds"]
    host = gen["host_seconds"] + prm["host_seconds"] + m["runtime_other_seconds"] + m["search_driver_seconds"] \
        + m["grading_seconds"]
    return {
        "problems": m["problems"], "batch": m["problem_batch"], "hide driver": m["hide_driver"],
        "overlap": m["overlap"], "async": m["async_scheduling"], "partial blocks": m["partial_blocks"],
        "low water": m["low_water"], "freeze heap": m["freeze_heap"], "problems/min": m["problems_per_min"],
        "ceiling/min": m["ceiling_problems_per_min"], "device busy": m["device_busy_fraction"],
        "gen busy": gen["busy_fraction"], "PRM busy": prm["busy_fraction"],
        "host share": host / wall,
        "gen host ms/step": (gen["host_seconds"]) * 1e3 / max(gen["steps"], 1),
        "PRM host ms/step": (prm["host_seconds"]) * 1e3 / max(prm["steps"], 1),
        "driver s": m["search_driver_seconds"], "grading s": m["grading_seconds"],
        "runtime s": m["runtime_other_seconds"],
        "gc s": m["gc_seconds"], "longest gc ms": 1e3 * m["gc_longest_pause_s"],
    }


def _phase_rows(m: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"problems": m["problems"], "batch": m["problem_batch"], "hide driver": m["hide_driver"],
             "overlap": m["overlap"], "async": m["async_scheduling"], "partial blocks": m["partial_blocks"],
             "low water": m["low_water"], "freeze heap": m["freeze_heap"], "engine": name,
             "steps": e["steps"],
             **{f"{p} ms": e[f"{p}_ms_per_step"] for p in PHASES}} for name, e in m["engines"].items()]


def _logged(log: Callable[[str], None], measure_one: Callable[[], dict]) -> Callable[[], dict]:
    def run() -> dict:
        m = measure_one()
        log(f"{m['problems']} problems, batch {m['problem_batch']}, hide_driver {m['hide_driver']}, "
            f"overlap {m['overlap']}, async_scheduling {m['async_scheduling']}, "
            f"partial_blocks {m['partial_blocks']}, low_water {m['low_water']}, freeze_heap {m['freeze_heap']}: "
            f"{m['problems_per_min']:.1f} problems/min, ceiling {m['ceiling_problems_per_min']:.1f}, "
            f"device busy {m['device_busy_fraction']:.0%}")
        return m
    return run


def bench_host(bench: HostBench, command: str, log: Callable[[str], None] = print) -> dict:
    device = resolve_device(bench.device)
    # Every selection and batch before the models load: a bad --limits is one line, not a minute in.
    selections = {limit: load_problems(DatasetConfig(dataset_path=bench.dataset_path, limit=limit))
                  for limit in bench.limits}
    for batch in bench.problem_batches:
        _search_config(bench, batch)  # raises on a bad --problem-batches
    log(f"loading {bench.generator} + {bench.prm} ...")
    models = tuple(load_model(name, resolve_dtype("auto", device), device) for name in (bench.generator, bench.prm))
    measured, medians = [], []
    for limit, problems in selections.items():
        _warm_grader(problems)
        for batch in bench.problem_batches:
            side = SideBySide(f"{limit}x{batch}")
            variants = {f"hide_driver={hide},overlap={overlap},async={ahead},partial_blocks={reuse},low_water={low},"
                        f"freeze_heap={freeze}":
                        _logged(log, partial(measure, bench, models, problems, batch, hide, overlap, ahead, reuse, low,
                                             freeze))
                        for hide in bench.hide_driver for overlap in bench.overlap
                        for ahead in bench.async_scheduling for reuse in bench.partial_blocks
                        for low in bench.generator_low_water for freeze in bench.freeze_heap}
            side.run(variants, bench.rounds)
            measured += [m for runs in side.runs.values() for m in runs]
            medians.append({"problems": limit, "problem_batch": batch,
                            **{label: side.median(label, "problems_per_min") for label in side.runs}})
    table = [_row(m) for m in measured]
    notes = [
        "Simulated H100 (`--device sim`): forwards run no math and take the H100 run's fitted cost "
        "(tts_runtime/executor/sim_costs.py), tokens are drawn from the demo run's step-length and EOS "
        "profile (tts_runtime/executor/sim_profile.json). Everything else runs for real on this CPU.",
        "ceiling = problems over the sum of the simulated forwards' costs (every forward back to back); "
        "device busy = that sum over the wall time.",
        "host ms/step = schedule + build inputs + launch + output processing (detokenize included) per "
        "engine step, i.e. the step's time less its wait for the device; the second table splits it.",
        "driver = wall time outside the runtime's steps and grading: the search coroutines, score cache, "
        "asyncio; runtime = the runtime's step less its engines' steps (phase choice, futures, block "
        "timelines).",
        "The host is this shared 2-core CPU, slower than an H100 server's host: host shares here are "
        "upper bounds for that machine.",
        "gc = Python's garbage collections during the run (all generations; longest: the longest pause).",
    ]
    summary = {"device": bench.device, "search": bench.config.to_dict(), "median_problems_per_min": medians,
               "runs": measured}
    path = write_report(bench.stem, "Host time of the main job on a simulated H100", command, summary, table, notes)
    phases = [row for m in measured for row in _phase_rows(m)]
    with path.open("a") as md:
        md.write("\nMilliseconds per engine step by phase (wait: blocked on the device):\n\n"
                 + _markdown_table(phases))
    return {"runs": measured}


def _markdown_table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(f"{row[k]:.3g}" if isinstance(row[k], float) else str(row[k]) for k in keys) + " |"
              for row in rows]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limits", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--problem-batches", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--device", default="sim", help="sim or sim:COSTS.json")
    parser.add_argument("--phase-policy", default="batched")
    parser.add_argument("--hide-driver", choices=("off", "on", "both"), default="off",
                        help="both: off and on side by side, alternating")
    parser.add_argument("--overlap", choices=("off", "on", "both"), default="off",
                        help="both: off and on side by side, alternating")
    parser.add_argument("--async-scheduling", choices=("off", "on", "both"), default="on",
                        help="both: off and on side by side, alternating")
    parser.add_argument("--partial-blocks", choices=("off", "on", "both"), default="on",
                        help="both: off and on side by side, alternating")
    parser.add_argument("--generator-low-water", type=int, nargs="+", default=list(HostBench.generator_low_water),
                        help="batched policy: one variant per value, side by side")
    parser.add_argument("--freeze-heap", choices=("off", "on", "both"), default="on",
                        help="both: off and on side by side, alternating")
    parser.add_argument("--rounds", type=int, default=1, help="alternating rounds; medians")
    parser.add_argument("--dataset-path", default=None)
    parser.add_argument("--stem", default="host", help="docs/benchmarks/<stem>.json/md")
    args = parser.parse_args(argv)
    switch = {"off": (False,), "on": (True,), "both": (False, True)}
    bench = HostBench(limits=args.limits, problem_batches=args.problem_batches, device=args.device,
                      phase_policy=args.phase_policy, rounds=args.rounds, hide_driver=switch[args.hide_driver],
                      overlap=switch[args.overlap],
                      async_scheduling=switch[args.async_scheduling],
                      partial_blocks=switch[args.partial_blocks],
                      generator_low_water=args.generator_low_water, freeze_heap=switch[args.freeze_heap],
                      dataset_path=args.dataset_path, stem=args.stem)
    bench_host(bench, shlex.join(["python", "-m", "evals.bench_host", *(argv or sys.argv[1:])]))


if __name__ == "__main__":
    main()
