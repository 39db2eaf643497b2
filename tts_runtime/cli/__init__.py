"""The `tts` command line (tts_runtime/cli/root.py builds it).

`main` is the console script. Until a command's own code runs (importing torch and the models'
code, then typer building and parsing the command: seconds), Ctrl-C prints one line and exits 130
straight from a signal handler. A KeyboardInterrupt raised there instead could land inside typer
(a traceback while it builds the command, a silent exit 130 while it parses) or inside an import
that runs code through the C API, after which CPython kills itself with SIGINT on exit (-2, not 130)
even though the interrupt was handled.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import Any


def main() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where Ctrl-C is ignored
        signal.signal(signal.SIGINT, _interrupted_while_starting)
    from tts_runtime.cli.root import app

    app()


def command_started() -> None:
    """From here on Ctrl-C raises KeyboardInterrupt: the command says itself what it kept."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupted_while_starting(signum: int, frame: FrameType | None) -> None:
    print("interrupted while starting", file=sys.stderr, flush=True)
    os._exit(130)  # nothing is written yet; no exception to land in someone else's code


def __getattr__(name: str) -> Any:
    if name == "app":  # `from tts_runtime.cli import app` (tests, python -m)
        from tts_runtime.cli.root import app

        return app
    raise AttributeError(name)
