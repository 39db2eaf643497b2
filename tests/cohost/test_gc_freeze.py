"""The heap frozen while a search runs (tts_runtime/cohost/gc_freeze.py): what was alive at its
start is out of the collector's walk, what the search makes is still collected, and the heap
is thawed when the search ends or fails."""

from __future__ import annotations

import gc

import pytest

from tts_runtime.cohost.gc_freeze import frozen_heap


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> None:
    first, second = _Node(), _Node()
    first.other, second.other = second, first


def test_objects_alive_at_the_start_are_frozen_and_thawed_after():
    assert gc.get_freeze_count() == 0
    with frozen_heap(True):
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # the interpreter, pytest and torch's objects at least
        _cycle()  # garbage made during the search: still collected
        assert gc.collect() >= 2
        assert gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == 0


def test_off_freezes_nothing_and_a_failure_thaws():
    with frozen_heap(False):
        assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError):
        with frozen_heap(True):
            raise RuntimeError("search failed")
    assert gc.get_freeze_count() == 0
