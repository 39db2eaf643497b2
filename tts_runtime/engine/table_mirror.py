"""A sequence's block table as an int32 array, copied only where it grew.

The batch builder pads every decode's table into one tensor each step; converting the
Python lists whole cost ~270 us a step at 64 sequences of 130 blocks, most of it copying
blocks that were already there the step before. A table is only ever extended in place
(`list.extend`) or replaced by a new list (preemption, a prefix-cache hit, a fork), never
rewritten, so the mirror copies the new tail, or starts over for a new list."""

from __future__ import annotations

import numpy as np


class TableMirror:
    def __init__(self) -> None:
        self._source: list[int] | None = None
        self._array = np.empty(0, dtype=np.int32)
        self._filled = 0

    def of(self, table: list[int]) -> np.ndarray:
        """`table` as int32 (a view, valid until the next call)."""
        if table is not self._source:
            self._source, self._filled = table, 0
        length = len(table)
        if length > self._filled:
            if length > len(self._array):
                grown = np.empty(max(2 * len(self._array), length, 8), dtype=np.int32)
                grown[:self._filled] = self._array[:self._filled]
                self._array = grown
            self._array[self._filled:length] = table[self._filled:length]
            self._filled = length
        return self._array[:length]
