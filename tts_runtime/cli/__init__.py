"""The `tts` command line (tts_runtime/cli/root.py builds it).

`main` is the console script: Ctrl-C before a command's own code runs is one line and exit
130 (cli/ctrl_c.py).
"""

from __future__ import annotations

from typing import Any

from tts_runtime.cli.ctrl_c import handle_ctrl_c_while_starting


def main() -> None:
    handle_ctrl_c_while_starting()
    from tts_runtime.cli.root import app

    app()


def __getattr__(name: str) -> Any:
    if name == "app":  # `from tts_runtime.cli import app` (tests, python -m)
        from tts_runtime.cli.root import app

        return app
    raise AttributeError(name)
