"""What every `tts` command shares: `command` (one-line errors for user mistakes), defaults, option parsing."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import typer
from rich.console import Console

from memory.split import MemoryConfig, parse_size
from search.config import SearchConfig
from tts_runtime.config import CohostConfig, ConfigError, SchedulerConfig, ThrottleConfig
from tts_runtime.executor.pipeline.pipeline import PipelineFailure

DEFAULT_GENERATOR = "smollm2-135m-instruct"
DEFAULT_PRM = "gemma3-270m"
ATTENTION_BACKENDS = ("auto", "cpu", "torch", "triton")
DTYPE_HELP = ("Both models' weights and activations: auto (bf16 on a GPU and on a CPU with AVX512-BF16, "
              "else fp32), float32 (the parity reference), bfloat16 or float16.")

console = Console(stderr=True)


def command(parent: typer.Typer, name: str, **options: Any) -> Callable[[Callable], Callable]:
    """Register `fn` as `parent`'s command `name`, with one-line errors for user mistakes."""
    def register(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except ConfigError as exc:
                typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
                raise typer.Exit(2) from None
            except PipelineFailure as exc:  # the first line names the stage; a traceback may follow
                typer.echo(f"error: {str(exc).splitlines()[0]}", err=True)
                raise typer.Exit(1) from None
        parent.command(name, **options)(run)
        return fn
    return register


# -- search commands -----------------------------------------------------------------

SEARCH = SearchConfig()
SCHEDULER = SchedulerConfig()
THROTTLE = ThrottleConfig()
COHOST = CohostConfig()


def parse_csv(text: str | None, what: str, cast: Callable[[str], Any]) -> set | None:
    if text is None:
        return None
    try:
        return {cast(item.strip()) for item in text.split(",") if item.strip()}
    except ValueError:
        raise ConfigError(f"--{what} takes a comma-separated list, e.g. 1,2,3; got '{text}'") from None


def memory_config(device_memory: str | None, memory_split: float, memory_policy: str) -> MemoryConfig:
    size = parse_size(device_memory) if device_memory else None
    return MemoryConfig(device_memory=size, prm_fraction=memory_split, policy=memory_policy)
