"""Continuous problem batching: up to `problem_batch` searches in flight on one runtime.

Every problem is an asyncio task; a semaphore admits `problem_batch` of them at a time, in
problem order, and a finished search frees its slot at once, so the engines' batches never
drain while problems remain. The runtime steps both engines whenever every search is
waiting on it. A problem's requests carry seeds derived from its own id and state, so its
result does not depend on which other problems shared its batches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from search.beam_search import beam_search
from search.beam_state import StepBackend
from search.best_of_n import best_of_n
from search.config import SearchConfig
from search.dvts import dvts
from search.problem import Problem
from search.progress import SearchProgress
from search.results import ProblemResult, summarize
from search.score_cache import ScoreCache
from search.session import SearchSession
from tts_runtime.cohost.runtime import Runtime

SEARCHES = {"beam": beam_search, "bon": best_of_n, "dvts": dvts}
ResultCallback = Callable[[ProblemResult], None]
FailureCallback = Callable[[Problem, Exception], None]


async def solve(steps: StepBackend, problem: Problem) -> ProblemResult:
    """Run the configured search on one problem through any step backend."""
    start = time.perf_counter()
    beams = await SEARCHES[steps.config.method](steps)
    return summarize(problem, beams, steps.config, steps.counts, time.perf_counter() - start)


async def arun_search(runtime: Runtime, problems: Sequence[Problem], config: SearchConfig, *,
                      on_result: ResultCallback | None = None,
                      cache: ScoreCache | None = None,
                      progress: SearchProgress | None = None,
                      on_failure: FailureCallback | None = None) -> list[ProblemResult]:
    """Search every problem; `on_result` sees each result as its problem ends (in finishing
    order); the returned list is in problem order. `progress` shows the searches in flight.
    An exception in one problem's search ends the run, unless `on_failure` is given: then
    that problem is handed to it, left out of the returned list, and the others go on (an
    error of the engines themselves still ends the run)."""
    session = SearchSession(runtime, config, cache)
    slots = asyncio.Semaphore(config.problem_batch)
    live = progress if progress is not None else SearchProgress()

    async def one(problem: Problem) -> ProblemResult | None:
        try:
            result = await searched(problem)
        except Exception as exc:
            if on_failure is None:
                raise
            on_failure(problem, exc)
            return None
        # Outside the try: a result that cannot be recorded (a full disk) ends the run
        # instead of being counted as this problem's failure.
        if on_result is not None:
            on_result(result)
        return result

    async def searched(problem: Problem) -> ProblemResult:
        async with slots:
            steps = session.steps_for(problem)
            live.in_flight[problem.id] = steps.counts
            try:
                result = await solve(steps, problem)
            finally:
                steps.close()
                live.in_flight.pop(problem.id, None)
            session.cache.drop_problem(problem.id)
        return result

    tasks = [asyncio.ensure_future(one(problem)) for problem in problems]
    everything = asyncio.gather(*tasks)
    # When Ctrl-C stops the run, the gathering future ends cancelled after this coroutine is
    # gone; reading its outcome here keeps asyncio from logging a traceback for it at exit.
    everything.add_done_callback(lambda done: done.cancelled() or done.exception())
    try:
        await runtime.drive(everything)
    except Exception:
        # Collect the stopped searches, so the error that ended the run is the only one reported.
        _cancel(tasks)
        await asyncio.gather(*tasks, return_exceptions=True)
        if everything.done() and not everything.cancelled():
            everything.exception()
        raise
    finally:
        # On an error, stop the other searches instead of leaving them waiting forever.
        _cancel(tasks)
    return [result for result in await everything if result is not None]


def _cancel(tasks: list[asyncio.Future]) -> None:
    for task in tasks:
        task.cancel()


def run_search(runtime: Runtime, problems: Sequence[Problem], config: SearchConfig, *,
               on_result: ResultCallback | None = None,
               cache: ScoreCache | None = None,
               progress: SearchProgress | None = None,
               on_failure: FailureCallback | None = None) -> list[ProblemResult]:
    return asyncio.run(arun_search(runtime, problems, config, on_result=on_result, cache=cache,
                                   progress=progress, on_failure=on_failure))
