"""`tts beam`, `tts bon`, `tts dvts`: a search on a dataset into a run folder (optionally scaled out with Ray)."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from search.progress import SearchProgress
from search.results import FailedProblem
from tts_runtime.cli.common import console
from tts_runtime.cli.ctrl_c import interrupted_by, stop_if_ctrl_c_was_swallowed
from tts_runtime.cli.options import config_command
from tts_runtime.cohost.runtime import Runtime
from tts_runtime.config import ConfigError
from tts_runtime.models.registry import require_tokenizers
from tts_runtime.runs.datasets import load_problems
from tts_runtime.runs.run import run_into_folder, run_record, split_finished
from tts_runtime.runs.run_config import RunConfig
from tts_runtime.runs.run_folder import METRICS_FILE, RunFolder
from tts_runtime.runs.scale_config import ScaleOut

if TYPE_CHECKING:
    from tts_runtime.runs.scaleout import ReplicaSpec


def _make_search_command(app: typer.Typer, method: str, summary: str) -> None:
    def search_command(run: RunConfig) -> None:
        _run_search_command(run)

    search_command.__doc__ = summary
    config_command(app, method, fixed={"method": method})(search_command)


def _run_search_command(run: RunConfig) -> None:
    problems = load_problems(run.dataset)
    if not problems:
        raise ConfigError("no problem matches the dataset filters (--limit, --levels, --ids)")
    generator, prm = run.models.specs()
    require_tokenizers(generator.model, prm.model)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = RunFolder.open(Path(run.out) if run.out else Path("runs") / f"{run.search.method}-{stamp}",
                            resume=run.resume, fresh=not run.out)
    try:
        _search_into(run, problems, folder)
    except BaseException:
        folder.abandon_if_empty()  # a new run that wrote no problem leaves nothing to --resume
        raise


def _search_into(run: RunConfig, problems: list, folder: RunFolder) -> None:
    generator, prm = run.models.specs()
    folder.write_config(run_record(run, sys.argv))
    finished = _finished_metrics(folder, problems)
    if finished is not None:
        console.print(f"{folder.path} already holds all {finished['problems']} problems; nothing to run",
                      soft_wrap=True, markup=False)
        _print_summary(finished, folder.path)
        return
    scale = run.scale.scale_out(run.engine.device)
    if scale is not None:
        from tts_runtime.runs.scaleout import ReplicaSpec  # imports Ray: only for runs that use it

        _run_scaled_command(run, problems, ReplicaSpec(generator, prm, run.memory, run.engine), folder, scale)
        return
    console.print(f"loading {generator.model} + {prm.model} ...")
    try:
        runtime = Runtime(generator, prm, memory=run.memory, engine_config=run.engine, backend=run.backend)
    except (Exception, KeyboardInterrupt) as exc:
        if not interrupted_by(exc):
            raise
        kept = "" if folder.abandon_if_empty() else f" ({folder.path})"
        console.print(f"interrupted while loading the models; nothing was searched{kept}", soft_wrap=True,
                      markup=False)
        raise typer.Exit(130) from None
    try:
        stop_if_ctrl_c_was_swallowed()  # while the models loaded: the runtime is shut down below
        live = SearchProgress()
        todo = len(split_finished(folder, problems)[1])
        with _SearchProgress(lambda: runtime.generator.stats.generated_tokens, todo, live.iteration) as progress:
            outcome = run_into_folder(runtime, problems, run.search, folder, on_result=progress.advance,
                                      progress=live)
        stop_if_ctrl_c_was_swallowed()
    except (Exception, KeyboardInterrupt) as exc:
        if not interrupted_by(exc):
            raise
        _interrupted(folder)
    finally:
        runtime.shutdown()
    _print_failures(outcome.failed)
    _print_summary(outcome.metrics, folder.path)


def _finished_metrics(folder: RunFolder, problems: list) -> dict | None:
    """metrics.json of a resumed run that has every problem done and its metrics written:
    there is nothing to search, so the models are not loaded (minutes for a large PRM)."""
    previous, todo = split_finished(folder, problems)
    if todo:
        return None
    try:
        metrics = folder.read_json(METRICS_FILE)
    except ConfigError:
        return None  # torn by a kill: the normal path writes it again
    return metrics if isinstance(metrics, dict) and metrics.get("problems") == len(previous) else None


def _run_scaled_command(run: RunConfig, problems: list, spec: ReplicaSpec, folder: RunFolder,
                        scale: ScaleOut) -> None:
    """The run on Ray replicas; one progress bar, started once the replicas are up."""
    from tts_runtime.runs.scaleout import run_scaled

    generated = [0]
    with ExitStack() as stack:
        bars: list[_SearchProgress] = []

        def started(pool, todo: int) -> None:
            hosts = sorted({replica.info.host for replica in pool.replicas})
            console.print(f"{len(pool.replicas)} replica(s) of {spec.generator.model} + {spec.prm.model} up on "
                          f"{', '.join(hosts)}")
            bars.append(stack.enter_context(_SearchProgress(lambda: generated[0], todo)))

        def landed(result) -> None:
            generated[0] += result.generated_tokens
            bars[0].advance(result)

        try:
            outcome = run_scaled(spec, problems, run.search, folder, scale, on_start=started, on_result=landed)
            stop_if_ctrl_c_was_swallowed()
        except (Exception, KeyboardInterrupt) as exc:
            if not interrupted_by(exc):
                raise
            _interrupted(folder)
    scaleout = outcome.metrics["scaleout"]
    _print_failures(outcome.failed)
    if scaleout["retries"] or scaleout["replica_restarts"]:
        console.print(f"{scaleout['retries']} problem(s) re-queued; {scaleout['replica_restarts']} replica(s) "
                      f"restarted, {scaleout['replicas_lost']} lost")
    _print_summary(outcome.metrics, folder.path)


def _interrupted(folder: RunFolder) -> None:
    if folder.abandon_if_empty():
        console.print("interrupted before any problem finished; nothing was kept")
    else:
        console.print(f"interrupted: finished problems are in {folder.path}; continue with --resume "
                      f"--out {shlex.quote(str(folder.path))}", soft_wrap=True, markup=False)
    raise typer.Exit(130) from None


class _Rate(ProgressColumn):
    """A rate read live from a counter (refreshed by rich's thread while the search runs)."""

    def __init__(self, read: Callable[[], float], unit: str) -> None:
        super().__init__()
        self.read, self.unit, self.start = read, unit, time.perf_counter()
        self.base = read()

    def render(self, task) -> Text:
        elapsed = time.perf_counter() - self.start
        value = (self.read() - self.base) / elapsed if elapsed > 0 else 0.0
        return Text(f"{value:.2f} {self.unit}")


class _Now(ProgressColumn):
    """A value read live (e.g. the furthest search iteration in flight)."""

    def __init__(self, read: Callable[[], object], label: str) -> None:
        super().__init__()
        self.read, self.label = read, label

    def render(self, task) -> Text:
        return Text(f"{self.label} {self.read()}")


class _SearchProgress:
    """Problems this session still has to solve, accuracy so far, the furthest iteration in
    flight, live problems/s and tokens/s. Without a terminal (a pipe, a CI log) a live bar
    shows nothing, so each finished problem is printed as one line instead."""

    def __init__(self, generated_tokens: Callable[[], float], total: int,
                 iteration: Callable[[], object] = lambda: "-") -> None:
        self.correct = 0
        self.done = 0
        self.total = total
        self.bar = Progress(
            TextColumn("[bold]problems"), BarColumn(), MofNCompleteColumn(),
            TextColumn("acc {task.fields[accuracy]}"), _Now(iteration, "iteration"),
            _Rate(lambda: self.done, "problems/s"),
            _Rate(generated_tokens, "tok/s"),
            TimeElapsedColumn(), console=console, disable=not console.is_terminal)
        self.task = self.bar.add_task("search", total=total, accuracy="-")

    def advance(self, result) -> None:
        stop_if_ctrl_c_was_swallowed()  # a problem's search that took the Ctrl-C as its failure
        self.done += 1
        self.correct += bool(result.correct)
        self.bar.update(self.task, advance=1, accuracy=f"{self.correct / self.done:.1%}")
        if not console.is_terminal:
            # Answers hold brackets and backslashes: print them as text, not rich markup.
            console.print(_result_line(result, self.done, self.total), markup=False, highlight=False,
                          soft_wrap=True)

    def __enter__(self) -> _SearchProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


def _result_line(result, done: int, total: int) -> str:
    verdict = "correct" if result.correct else "wrong"
    return (f"[{done}/{total}] {result.id} (level {result.level}): {verdict}, answer {result.prediction} "
            f"(reference {result.reference}); {result.iterations} iterations, "
            f"{result.generated_tokens} tokens, {result.seconds:.1f} s")


def _print_failures(failed: list[FailedProblem]) -> None:
    for failure in failed:
        console.print(f"failed, its error is in results.jsonl (--resume retries it): {failure.id}: {failure.error}")


def _print_summary(metrics: dict, folder: Path) -> None:
    speed = metrics["throughput"]
    table = Table(title=f"{metrics['problems']} problems  ·  {folder}", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("accuracy (best beam)", f"{metrics['accuracy']:.1%}")
    table.add_row("accuracy (weighted vote)", f"{metrics['weighted_accuracy']:.1%}")
    table.add_row("accuracy (majority vote)", f"{metrics['majority_accuracy']:.1%}")
    for level, row in metrics["per_level"].items():
        table.add_row(f"  level {level}", f"{row['accuracy']:.1%} of {row['problems']}")
    table.add_row("problems/min", f"{speed['problems_per_min']:.2f}")
    table.add_row("generator tokens (per s)", f"{speed['generated_tokens']} ({speed['generator_tokens_per_s']:.1f})")
    table.add_row("PRM tokens (per s)", f"{speed['prm_tokens']} ({speed['prm_tokens_per_s']:.1f})")
    table.add_row("prefix hit rate generator / PRM",
                  f"{speed['prefix_hit_rate']['generator']:.1%} / {speed['prefix_hit_rate']['prm']:.1%}")
    table.add_row("score-cache hit rate", f"{speed['score_cache']['hit_rate']:.1%}")
    table.add_row("run folder", str(folder))
    Console().print(table)


def register(app: typer.Typer) -> None:
    _make_search_command(app, "beam", "PRM-guided beam search on a dataset.")
    _make_search_command(app, "bon", "Best-of-N: N whole samples, PRM-scored, then naive/weighted/majority picks.")
    _make_search_command(app, "dvts", "Diverse verifier tree search: n/M independent subtrees of width M.")
