"""What the searches in flight are doing, for a live progress display.

The driver registers each problem's work counters while its search runs; a display
thread reads them (plain ints, so a read never sees a torn value)."""

from __future__ import annotations

from dataclasses import dataclass, field

from search.beam_state import StepCounts


@dataclass
class SearchProgress:
    in_flight: dict[str, StepCounts] = field(default_factory=dict)

    def iteration(self) -> int:
        """The furthest iteration any search in flight has reached (0 when none runs)."""
        return max((counts.iterations for counts in list(self.in_flight.values())), default=0)
