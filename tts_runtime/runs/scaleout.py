"""A search run spread over Runtime replicas on Ray, written into one run folder.

Each replica is a Ray actor that builds its own Runtime (generator + PRM on its device)
and solves the problems it is handed, up to `problem_batch` at once, sharing its engines'
batches. The driver (this process) owns the run folder: it hands problems out from one
queue as replicas free up (tts_runtime/runs/ray_pool.py), appends each result to `results.jsonl` as
it arrives, and writes config.json and metrics.json like a one-process run
(tts_runtime/runs/run.py), so `--resume` and every reader of a run folder work unchanged.

Faults: a replica that dies is restarted once by Ray and its in-flight problems go back
on the queue without being charged (a problem that kills replicas is found by running it
alone); a replica that stops answering heartbeats is killed and replaced (ray_pool.py);
a problem that fails on two replicas gets a failure line in results.jsonl (its id
and error, as a one-process run writes for a search that raised), is listed under
`failed` and `scaleout.failed` in metrics.json, and a later `--resume` tries it again. Killing the driver loses no finished problem: they are fsynced one by
one; the local Ray cluster dies with the driver.

This is a driver module: only the CLI and evals/memory_sweep.py import it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from memory.split import MemoryConfig
from search import ProblemResult, ScoreCache, SearchConfig, arun_search
from search.results import FailedProblem
from tts_runtime.cohost.runtime import Runtime
from tts_runtime.config import EngineConfig, ModelSpec
from tts_runtime.runs.datasets import Problem
from tts_runtime.runs.metrics import EngineCounters, RunCounters, run_metrics
from tts_runtime.runs.ray_pool import ReplicaInfo, ReplicaPool, WorkItem, ray_cluster
from tts_runtime.runs.run import RunOutcome, check_models, failed_metrics, split_finished, write_sal_outputs
from tts_runtime.runs.run_folder import RunFolder
from tts_runtime.runs.scale_config import ScaleOut


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica builds its Runtime from (models by name: each node loads its own)."""

    generator: ModelSpec
    prm: ModelSpec
    memory: MemoryConfig
    engine_config: EngineConfig


class _SharedStepping:
    """One runtime seen by many concurrent `arun_search` calls, stepped by one loop.

    Every call would otherwise run its own `Runtime.drive` loop, and several loops step the
    engines before the searches they just woke have queued their next requests, which
    splits the batches. Everything but `drive` goes to the runtime itself."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._waiting = 0
        self._idle: asyncio.Future | None = None
        self._stepper: asyncio.Task | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runtime, name)

    async def drive(self, until: asyncio.Future) -> None:
        if self._stepper is None or self._stepper.done() or self._idle.done():
            self._idle = asyncio.get_running_loop().create_future()
            self._stepper = asyncio.ensure_future(self._runtime.drive(self._idle))
        stepper, idle = self._stepper, self._idle
        self._waiting += 1
        try:
            await asyncio.wait({until, stepper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._waiting -= 1
            if self._waiting == 0 and not idle.done():
                idle.set_result(None)
        if not until.done():
            stepper.result()  # the engines failed: raise their error in every search


class SearchReplica:
    """A Ray actor: one Runtime solving the problems the driver hands it."""

    def __init__(self, spec: ReplicaSpec, config: SearchConfig, threads: int) -> None:
        torch.set_num_threads(threads)
        self.runtime = Runtime(spec.generator, spec.prm, memory=spec.memory, engine_config=spec.engine_config)
        self.config = config
        self.cache = ScoreCache()
        self.stepping = _SharedStepping(self.runtime)
        self.start = RunCounters.read(self.runtime, self.cache)

    def ready(self) -> ReplicaInfo:
        return ReplicaInfo.here()

    async def solve(self, problem: Problem) -> ProblemResult:
        [result] = await arun_search(self.stepping, [problem], self.config, cache=self.cache)
        return result

    def check(self) -> None:
        """One-line errors for models that cannot play their part (run.check_models)."""
        check_models(self.runtime, self.config)

    def report(self) -> tuple[RunCounters, dict[str, Any]]:
        """Work done since this replica started (a restarted one counts from its restart)
        and its memory metrics."""
        return RunCounters.read(self.runtime, self.cache) - self.start, self.runtime.memory_metrics()


def _sum_counters(counters: Sequence[RunCounters]) -> RunCounters:
    def engines(name: str) -> EngineCounters:
        return EngineCounters(**{f.name: sum(getattr(getattr(c, name), f.name) for c in counters)
                                 for f in fields(EngineCounters)})

    return RunCounters(engines("generator"), engines("prm"), sum(c.cache_hits for c in counters),
                       sum(c.cache_misses for c in counters))


def run_scaled(spec: ReplicaSpec, problems: Sequence[Problem], config: SearchConfig, folder: RunFolder,
               scale: ScaleOut, *, on_start: Callable[[ReplicaPool, int], None] | None = None,
               on_result: Callable[[ProblemResult], None] | None = None) -> RunOutcome:
    """Solve the problems not yet in `folder` on `scale.replicas` replicas; `on_start` sees
    the pool (ready) and how many problems are left, `on_result` each result as it lands."""
    previous, todo = split_finished(folder, problems)
    outcome = RunOutcome({}, previous)
    failed: list[dict[str, str]] = []
    levels = {problem.id: problem.level for problem in todo}
    with ray_cluster(scale):
        pool = ReplicaPool(SearchReplica, (spec, config, scale.threads_per_replica), scale,
                           per_replica=config.problem_batch, hang_timeout_s=scale.hang_timeout_s)
        try:
            started = time.perf_counter()
            pool.wait_ready()
            startup = time.perf_counter() - started
            pool.call_one("check")
            if on_start is not None:
                on_start(pool, len(todo))
            start = time.perf_counter()
            try:
                for item in pool.run("solve", [WorkItem(problem.id, (problem,)) for problem in todo]):
                    if item.error is not None:
                        failure = FailedProblem(item.key, levels[item.key], item.error)
                        folder.append(failure)
                        outcome.failed.append(failure)
                        failed.append({"id": item.key, "error": item.error})
                        continue
                    folder.append(item.value)
                    outcome.new.append(item.value)
                    if on_result is not None:
                        on_result(item.value)
            finally:
                folder.close()
            seconds = time.perf_counter() - start
            reports = pool.call_all("report")
        finally:
            pool.shutdown()
    memory = {"per_replica": [metrics for _, metrics in reports]}
    outcome.metrics = run_metrics(previous + outcome.new, outcome.new, seconds,
                                  _sum_counters([counters for counters, _ in reports]), memory)
    outcome.metrics["scaleout"] = {**pool.stats(), "startup_seconds": startup, "failed": failed}
    outcome.metrics["failed"] = failed_metrics(outcome.failed)
    write_sal_outputs(folder, problems, previous + outcome.new, config, outcome.metrics)
    folder.write_metrics(outcome.metrics)
    return outcome
