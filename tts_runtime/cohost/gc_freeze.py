"""The heap frozen while a search runs, so Python's garbage collector skips what lives all run.

A full (generation 2) collection walks every tracked object: the models' modules, the
tokenizers, the engines' sequences and block tables, sympy and transformers' module state.
On the main job that is a stop-the-world pause of 0.25-0.6 s with the device left idle,
spent mostly on objects that live all run (docs/benchmarks/host_gc_freeze.md). `gc.freeze()` moves every
object alive at the search's start to a permanent generation that collections skip; objects
made during the search are collected as before. The heap is thawed when the search ends, so
a runtime dropped later (sweeps and benchmarks build many) is still collected.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def frozen_heap(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
