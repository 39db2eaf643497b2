"""What every `tts` command shares: `command` (one-line errors for user mistakes) and the console."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from tts_runtime.cli.starting import command_started
from tts_runtime.config import ConfigError
from tts_runtime.executor.pipeline.pipeline import PipelineFailure

console = Console(stderr=True)


def command(parent: typer.Typer, name: str, **options: Any) -> Callable[[Callable], Callable]:
    """Register `fn` as `parent`'s command `name`, with one-line errors for user mistakes."""
    def register(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            command_started()
            try:
                return fn(*args, **kwargs)
            except ConfigError as exc:
                typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
                raise typer.Exit(2) from None
            except PipelineFailure as exc:  # the first line names the stage; a traceback may follow
                typer.echo(f"error: {str(exc).splitlines()[0]}", err=True)
                raise typer.Exit(1) from None
            except KeyboardInterrupt:  # a search keeps its results and says so itself; this is the rest
                typer.echo("interrupted", err=True)
                raise typer.Exit(130) from None
        parent.command(name, **options)(run)
        return fn
    return register


def check_names(chosen: tuple[str, ...], what: str, known: tuple[str, ...]) -> list[str]:
    """A chosen list of `known` names (e.g. a benchmark's variants), each one known."""
    unknown = [name for name in chosen if name not in known]
    if unknown or not chosen:
        raise ConfigError(f"--{what} takes a comma-separated list of {', '.join(known)}; got '{','.join(chosen)}'")
    return list(chosen)
