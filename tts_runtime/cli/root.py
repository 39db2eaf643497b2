"""The `tts` Typer app: every command group and command, registered in one place.

Every command is registered with `command(parent, name)` (cli/common.py), which prints a user
mistake (any ConfigError) as one line `error: ...` with exit code 2 instead of a traceback;
the search and benchmark commands take their options from the run configuration
(cli/options.py).
"""

from __future__ import annotations

import typer

import tts_runtime.cli.memory as memory_command
import tts_runtime.cli.search as search_commands
from tts_runtime.cli.bench import bench_app
from tts_runtime.cli.common import OneLineUsageErrors
from tts_runtime.cli.models import models_app

app = typer.Typer(name="tts", help="Test-time-compute search: PRM-guided beam search, best-of-N, DVTS.",
                  cls=OneLineUsageErrors, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_show_locals=False)
app.add_typer(models_app, name="models")
app.add_typer(bench_app, name="bench")
search_commands.register(app)
memory_command.register(app)
