"""`tts sweep-memory`: the memory-split sweep (evals/memory_sweep.py)."""

from __future__ import annotations

import typer

from evals.memory_sweep import sweep_memory
from tts_runtime.cli.common import command


def register(app: typer.Typer) -> None:
    command(app, "sweep-memory")(sweep_memory)
