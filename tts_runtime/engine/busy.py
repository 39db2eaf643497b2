"""How long an engine had a forward in flight: the union of its microbatches' launch-to-result
intervals, so microbatches that overlap (a pipeline keeps several in flight) count once. A
runtime gives its engines' clocks one parent: the union over both engines, the time the
device had any forward in flight (queued forwards of the two overlap in time)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future


class BusyClock:
    """`start` at each launch, `stop` when its result arrives (a future's done callback, which a
    pipeline runs on its receiving thread, hence the lock)."""

    def __init__(self, parent: BusyClock | None = None) -> None:
        self.parent = parent
        self._lock = threading.Lock()
        self._in_flight = 0
        self._since = 0.0
        self._seconds = 0.0

    def start(self) -> None:
        with self._lock:
            if self._in_flight == 0:
                self._since = time.perf_counter()
            self._in_flight += 1
        if self.parent is not None:
            self.parent.start()

    def stop(self, _: Future | None = None) -> None:
        with self._lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._seconds += time.perf_counter() - self._since
        if self.parent is not None:
            self.parent.stop()

    @property
    def seconds(self) -> float:
        """Busy seconds so far, an interval still open counted up to now."""
        with self._lock:
            open_part = time.perf_counter() - self._since if self._in_flight else 0.0
            return self._seconds + open_part
