"""Ctrl-C before the search starts (while Python imports tts, while typer builds the command,
while the models load) ends the command with one line and exit status 130, never a traceback,
click's bare "Aborted!" or typer's silent exit."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.helpers import default_sigint, ended_by_ctrl_c


def _start(math500_path, tmp_path) -> subprocess.Popen:
    command = [sys.executable, "-m", "tts_runtime.cli", "beam", "--dataset-path", str(math500_path), "--limit", "1",
               "--device-memory", "3GiB", "--out", str(tmp_path / "run")]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)


def _interrupted(process: subprocess.Popen) -> list[str]:
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert ended_by_ctrl_c(process.returncode), stderr
    assert "Traceback" not in stderr and "Aborted" not in stderr, stderr
    return stderr.strip().splitlines()


@pytest.mark.parametrize("seconds", [0.4, 1.0, 1.6, 2.2, 2.8])
def test_ctrl_c_while_starting_is_one_line(math500_path, tmp_path, seconds):
    process = _start(math500_path, tmp_path)
    time.sleep(seconds)  # importing torch, typer building the command, loading: each one line
    lines = _interrupted(process)
    assert lines[-1].startswith("interrupted"), lines


@pytest.mark.slow
def test_ctrl_c_while_loading_the_models_is_one_line(math500_path, tmp_path):
    process = _start(math500_path, tmp_path)
    assert process.stderr is not None
    for line in process.stderr:  # the CLI says when it starts loading
        if line.startswith("loading"):
            break
    time.sleep(0.1)  # the load and the memory profile take seconds
    lines = _interrupted(process)
    assert lines[-1] == "interrupted while loading the models; nothing was searched", lines
    assert not (tmp_path / "run").exists()  # a new run with nothing in it: the same command starts anew



_COMMANDS_WHOSE_CTRL_C_A_LIBRARY_TAKES = textwrap.dedent("""
    import signal, sys, time
    import typer
    from tts_runtime.cli.common import command
    from tts_runtime.cli.ctrl_c import handle_ctrl_c_while_starting, stop_if_ctrl_c_was_swallowed

    app = typer.Typer()

    class PressesCtrlC:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # the handler runs here, inside the finalizer

    class Finalized:
        def __del__(self):
            sum(range(10))

    @command(app, "finalizer")
    def finalizer() -> None:
        freed = [PressesCtrlC(), Finalized(), Finalized()]  # the ones after it run Python code too
        del freed
        time.sleep(600)  # woken by the interrupt
        print("went on", file=sys.stderr)

    @command(app, "converted")
    def converted() -> None:
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:  # what torch did under safetensors' reader
            raise ValueError("could not determine the shape of object type") from None

    @command(app, "swallowed")
    def swallowed() -> None:
        try:
            signal.raise_signal(signal.SIGINT)
        except BaseException:
            pass
        stop_if_ctrl_c_was_swallowed()
        print("went on", file=sys.stderr)

    handle_ctrl_c_while_starting()
    app()
""")


@pytest.mark.parametrize("taken", ["finalizer", "converted", "swallowed"])
def test_ctrl_c_a_library_takes_still_interrupts_the_command(taken):
    """Python drops an exception raised in `__del__` (a Ctrl-C in regex's finalizer while
    transformers loads), torch turned one into a ValueError under safetensors' reader, and code
    may swallow one: each still ends the command with one line and exit 130."""
    process = subprocess.run([sys.executable, "-c", _COMMANDS_WHOSE_CTRL_C_A_LIBRARY_TAKES, taken],
                             capture_output=True, text=True, timeout=60, preexec_fn=default_sigint)
    assert process.returncode == 130, process.stderr
    assert process.stderr.strip().splitlines() == ["interrupted"], process.stderr
