"""One evaluation run into a run folder: skip what is already there, search the rest, append
each result as its problem ends, then write metrics over every finished problem.

A problem whose search raises does not end the run: its line in results.jsonl holds its id
and the error, metrics.json counts it under `failed`, and `--resume` searches it again."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from search.config import SAL_SWITCHES, SearchConfig
from search.driver import run_search
from search.prm import check_prm_head
from search.problem import Problem
from search.progress import SearchProgress
from search.results import FailedProblem, ProblemResult
from search.sal_outputs import accuracy_at_k, completions_file, sal_row
from search.score_cache import ScoreCache
from search.session import prm_format_name
from tts_runtime.cohost.runtime import Runtime
from tts_runtime.config import ConfigError, resolve_device, resolve_dtype
from tts_runtime.models.registry import resolve
from tts_runtime.runs.datasets import local_dataset_file
from tts_runtime.runs.environment import environment
from tts_runtime.runs.fingerprints import dataset_fingerprint, model_fingerprint
from tts_runtime.runs.metrics import RunCounters, run_metrics
from tts_runtime.runs.run_config import RunConfig
from tts_runtime.runs.run_folder import RunFolder, RunFolderWriteError


@dataclass
class RunOutcome:
    metrics: dict[str, Any]
    previous: list[ProblemResult]  # finished by an earlier, resumed session
    new: list[ProblemResult] = field(default_factory=list)
    failed: list[FailedProblem] = field(default_factory=list)  # this session's failures


def check_models(runtime: Runtime, config: SearchConfig) -> None:
    """One-line errors for models that cannot play their part: a reward-head model cannot
    generate, and a PRM's head must be the one its format reads."""
    if runtime.generator.arch.has_reward_head:
        raise ConfigError(f"generator {runtime.generator.spec.model} has a reward head instead of an LM head: "
                          "it can only be a --prm")
    prm = runtime.prm.spec.model
    check_prm_head(prm_format_name(config, prm), prm, runtime.prm.arch.has_reward_head)


def run_record(run: RunConfig, command: Sequence[str]) -> dict[str, Any]:
    """config.json: the run configuration (what `--config` reads back), what it resolves to
    on this machine, the machine and versions, and the command line. Built before any model
    loads, so a resume that does not match is refused at once."""
    device = resolve_device(run.engine.device)
    search = run.search.resolved()
    return {
        **run.to_dict(),
        "resolved": {"dtype": str(resolve_dtype(run.models.dtype, device)),
                     "prm_format": prm_format_name(run.search, run.models.specs()[1].model),
                     **{name: getattr(search, name) for name in ("seed", *SAL_SWITCHES)}},
        "fingerprints": fingerprints(run),
        **environment(device),
        "command": list(command),
    }


def fingerprints(run: RunConfig) -> dict[str, Any]:
    """What the models and the dataset hold, so that a resume compares content, not names
    (a re-downloaded model or another TTS_DATA_DIR behind the same name)."""
    def model(name: str) -> dict[str, Any]:
        where = resolve(name)
        return {"dummy": name} if where.location is None else model_fingerprint(where.location)

    generator, prm = run.models.specs()
    dataset = local_dataset_file(run.dataset)
    return {"generator": model(generator.model), "prm": model(prm.model),
            "dataset": {"hub": run.dataset.dataset} if dataset is None else dataset_fingerprint(dataset)}


def failed_metrics(failed: Sequence[FailedProblem]) -> dict[str, Any]:
    """metrics.json's `failed`: problems of this session whose search raised (not in the
    accuracy; `--resume` retries them)."""
    return {"count": len(failed), "problems": [failure.to_dict() for failure in failed]}


def split_finished(folder: RunFolder, problems: Sequence[Problem]) -> tuple[list[ProblemResult], list[Problem]]:
    """(results of these problems already in the folder, the problems still to solve)."""
    wanted = {problem.id for problem in problems}
    previous = [result for result in folder.finished_results() if result.id in wanted]
    done = {result.id for result in previous}
    return previous, [problem for problem in problems if problem.id not in done]


def write_sal_outputs(folder: RunFolder, problems: Sequence[Problem], results: Sequence[ProblemResult],
                      config: SearchConfig, metrics: dict[str, Any]) -> None:
    """search-and-learn's completions file of the finished problems (in problem order) and
    its accuracy at every k, graded by the run's grader, into metrics."""
    by_id = {result.id: result for result in results}
    rows = [sal_row(problem, by_id[problem.id], config.n) for problem in problems if problem.id in by_id]
    folder.write_rows(completions_file(config.method), rows)
    metrics["grader"] = config.grader
    metrics["accuracy_at_k"] = accuracy_at_k(rows, config.n, config.grader)


def run_into_folder(runtime: Runtime, problems: Sequence[Problem], config: SearchConfig, folder: RunFolder,
                    *, on_result: Callable[[ProblemResult], None] | None = None,
                    progress: SearchProgress | None = None) -> RunOutcome:
    check_models(runtime, config)
    previous, todo = split_finished(folder, problems)
    outcome = RunOutcome({}, previous)

    def record(result: ProblemResult) -> None:
        folder.append(result)
        outcome.new.append(result)
        if on_result is not None:
            on_result(result)

    def record_failure(problem: Problem, exc: Exception) -> None:
        failure = FailedProblem.of(problem, exc)
        folder.append(failure)
        outcome.failed.append(failure)

    cache = ScoreCache()
    before = RunCounters.read(runtime, cache)
    cohost_before = runtime.cohost_counters()
    start = time.perf_counter()

    def write_metrics() -> None:
        seconds = time.perf_counter() - start
        work = RunCounters.read(runtime, cache) - before
        cohost_after = runtime.cohost_counters()
        cohost = None if cohost_after is None else (cohost_after - cohost_before).report(seconds, runtime.cohost)
        outcome.metrics = run_metrics(previous + outcome.new, outcome.new, seconds, work,
                                      runtime.memory_metrics(), cohost)
        outcome.metrics["failed"] = failed_metrics(outcome.failed)
        write_sal_outputs(folder, problems, previous + outcome.new, config, outcome.metrics)
        folder.write_metrics(outcome.metrics)

    try:
        run_search(runtime, todo, config, on_result=record, cache=cache, progress=progress,
                   on_failure=record_failure)
    except RunFolderWriteError:
        folder.close()
        try:  # metrics over what was written, if the disk still takes the small file
            write_metrics()
        except RunFolderWriteError:
            pass
        raise
    finally:
        folder.close()
    write_metrics()
    return outcome
