"""The `tts` command line: searches on datasets, model listing and benchmarks.

Every command is registered with `command(parent, name)`, which prints a user mistake
(any ConfigError) as one line `error: ...` with exit code 2 instead of a traceback.
Adding a command is one decorated function; adding a group is one `add_typer` line.
"""

from __future__ import annotations

import typer

from tts_runtime.cli import memory, search
from tts_runtime.cli.bench import bench_app
from tts_runtime.cli.models import models_app


app = typer.Typer(name="tts", help="Test-time-compute search: PRM-guided beam search, best-of-N, DVTS.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_show_locals=False)
app.add_typer(models_app, name="models")
app.add_typer(bench_app, name="bench")
search.register(app)
memory.register(app)
