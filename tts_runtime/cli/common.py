"""What every `tts` command shares: `command` and the root group (one-line errors for user
mistakes) and the console."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from tts_runtime.cli.ctrl_c import command_started, interrupted_by
from tts_runtime.config import ConfigError
from tts_runtime.executor.pipeline.pipeline import PipelineFailure

console = Console(stderr=True)


def command(parent: typer.Typer, name: str, **options: Any) -> Callable[[Callable], Callable]:
    """Register `fn` as `parent`'s command `name`, with one-line errors for user mistakes and
    its docstring as the help."""
    def register(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            command_started()
            try:
                return fn(*args, **kwargs)
            except typer.Exit:  # the command said itself how it ended (a search: what it kept)
                raise
            except (Exception, KeyboardInterrupt) as exc:
                if interrupted_by(exc):  # before the rest: a Ctrl-C turned into an error is no error
                    typer.echo("interrupted", err=True)
                    raise typer.Exit(130) from None
                if isinstance(exc, ConfigError):
                    typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
                    raise typer.Exit(2) from None
                if isinstance(exc, PipelineFailure):  # the first line names the stage; a traceback may follow
                    typer.echo(f"error: {str(exc).splitlines()[0]}", err=True)
                    raise typer.Exit(1) from None
                raise
        if fn.__doc__ and "help" not in options:
            options["help"] = flowing(fn.__doc__)
        parent.command(name, **options)(run)
        return fn
    return register


def flowing(doc: str) -> str:
    """A docstring as help text: each paragraph one line, for the terminal to wrap (rich keeps
    a docstring's line breaks, which then break the help's lines at random places)."""
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in inspect.cleandoc(doc).split("\n\n"))


class OneLineUsageErrors(TyperGroup):
    """The root group: a mistake click finds before any command runs (an unknown option, a
    value that is not a number) is one `error: ...` line with exit code 2 too, not a panel."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)
        try:
            # Not standalone: click raises its errors here instead of printing them itself,
            # and returns the exit code of a command that raised typer.Exit.
            code = super().main(*args, standalone_mode=False, **kwargs)
        except typer.TyperException as exc:  # click's errors (typer carries its own click)
            if type(exc).__name__ == "NoArgsIsHelpError":  # typer printed the help as it raised it
                sys.exit(exc.exit_code)
            context = getattr(exc, "ctx", None)
            hint = f"; see `{context.command_path} --help`" if context is not None else ""
            typer.echo(f"error: {' '.join(exc.format_message().split()).rstrip('.')}{hint}", err=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            typer.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def check_names(chosen: tuple[str, ...], what: str, known: tuple[str, ...]) -> list[str]:
    """A chosen list of `known` names (e.g. a benchmark's variants), each one known."""
    unknown = [name for name in chosen if name not in known]
    if unknown or not chosen:
        raise ConfigError(f"--{what} takes a comma-separated list of {', '.join(known)}; got '{','.join(chosen)}'")
    return list(chosen)
