"""Ctrl-C before a command's own code runs: one line and exit 130, straight from a handler.

Until then (importing torch and the models' code, typer building and parsing the command:
seconds), a KeyboardInterrupt could land inside typer (a traceback while it builds the command,
a silent exit 130 while it parses) or inside a third-party import that catches it or turns it
into another error, so the console script installs this handler instead; the command wrapper
(cli/common.py) restores KeyboardInterrupt as its first step.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType


def handle_ctrl_c_while_starting() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where Ctrl-C is ignored
        signal.signal(signal.SIGINT, _interrupted_while_starting)


def command_started() -> None:
    """From here on Ctrl-C raises KeyboardInterrupt: the command says itself what it kept."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupted_while_starting(signum: int, frame: FrameType | None) -> None:
    print("interrupted while starting", file=sys.stderr, flush=True)
    os._exit(130)  # nothing is written yet; no exception to land in someone else's code
