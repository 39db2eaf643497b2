"""Ctrl-C in a `tts` command: one line and exit 130, never a traceback, and never lost.

Until the command's own code runs (importing torch and the models' code, typer building and
parsing the command: seconds), a KeyboardInterrupt could land inside typer (a traceback while it
builds the command, a silent exit 130 while it parses) or inside a third-party import that
catches it or turns it into another error, so the console script installs a handler that exits
at once; the command wrapper (cli/common.py) then installs one that raises KeyboardInterrupt, for
the command to say what it kept.

Once the command runs, third-party code can still take the KeyboardInterrupt away:
* Python drops an exception raised in a finalizer (`__del__`, a weakref callback) after printing
  "Exception ignored": a Ctrl-C landing in regex's `__del__` while transformers loads went
  unnoticed and the command went on loading the models. The unraisable hook delivers it again.
* torch, called back from safetensors' reader, turned one into `ValueError: could not determine
  the shape of object type 'torch.storage.UntypedStorage'`. The handler records every Ctrl-C, and
  the commands take any error raised after one for the interrupt (`interrupted_by`).
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
from types import FrameType


class _CtrlC:
    pressed = False


def handle_ctrl_c_while_starting() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where Ctrl-C is ignored
        signal.signal(signal.SIGINT, _interrupted_while_starting)


def command_started() -> None:
    """From here on Ctrl-C raises KeyboardInterrupt in the command: the command says itself what it kept."""
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, _raise_keyboard_interrupt)
        sys.unraisablehook = _redeliver_ctrl_c_from_finalizers


def ctrl_c_pressed() -> bool:
    return _CtrlC.pressed


def interrupted_by(exc: BaseException) -> bool:
    """Whether `exc` is, or may be, the command's Ctrl-C: a KeyboardInterrupt, or any error raised
    after one (a library turned it into its own error)."""
    return isinstance(exc, KeyboardInterrupt) or _CtrlC.pressed


def stop_if_ctrl_c_was_swallowed() -> None:
    """A point where the command can stop cleanly: raise the Ctrl-C that a library swallowed."""
    if _CtrlC.pressed:
        raise KeyboardInterrupt


def _interrupted_while_starting(signum: int, frame: FrameType | None) -> None:
    print("interrupted while starting", file=sys.stderr, flush=True)
    os._exit(130)  # nothing is written yet; no exception to land in someone else's code


def _raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    _CtrlC.pressed = True
    raise KeyboardInterrupt


def _redeliver_ctrl_c_from_finalizers(unraisable: sys.UnraisableHookArgs) -> None:
    if issubclass(unraisable.exc_type, KeyboardInterrupt):
        if sys.is_finalizing():  # the process is ending anyway, and no thread can start now
            return
        # Sent from another thread: sent from this one, the handler would run as soon as the call
        # returned, still inside the hook. The main thread (the only one a KeyboardInterrupt is
        # raised in) takes it at its next check, after this finalizer (or inside the next one,
        # which lands here again); a real signal also wakes it from a blocking call.
        _thread.start_new_thread(signal.pthread_kill, (_thread.get_ident(), signal.SIGINT))
        return
    sys.__unraisablehook__(unraisable)
