"""The `tts` command line (tts_runtime/cli/root.py builds it).

`main` is the console script: it imports the app (torch and the models' code, seconds) inside
its own Ctrl-C handler, so an interrupt while starting is one line, not a traceback.
"""

from __future__ import annotations

import sys
from typing import Any


def main() -> None:
    try:
        from tts_runtime.cli.root import app
    except KeyboardInterrupt:
        print("interrupted while starting", file=sys.stderr)
        raise SystemExit(130) from None
    app()


def __getattr__(name: str) -> Any:
    if name == "app":  # `from tts_runtime.cli import app` (tests, python -m)
        from tts_runtime.cli.root import app

        return app
    raise AttributeError(name)
