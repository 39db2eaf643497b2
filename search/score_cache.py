"""Step-score cache: a step prefix the PRM has scored once is never sent to it again.

Key: (PRM name, problem id, exact texts of steps 1..k) -> score of step k. Beams copied
when the search refills, and every earlier step of a beam re-sent each iteration, are
hits. Memory: one float per distinct scored step prefix, i.e. at most one per PRM call;
the key tuples reference the step strings the beams already hold. Entries live until
`drop_problem` (the driver calls it when a problem finishes), so the cache holds only
the problems in flight and needs no eviction policy.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field


@dataclass
class ScoreCache:
    hits: int = 0
    misses: int = 0
    # problem id -> (prm name, step prefix) -> score; grouped by problem so dropping one is O(1).
    _scores: dict[Hashable, dict[tuple[str, tuple[str, ...]], float]] = field(default_factory=dict, repr=False)

    def get(self, prm: str, problem_id: Hashable, steps: Sequence[str]) -> float | None:
        score = self._scores.get(problem_id, {}).get((prm, tuple(steps)))
        if score is None:
            self.misses += 1
        else:
            self.hits += 1
        return score

    def put(self, prm: str, problem_id: Hashable, steps: Sequence[str], score: float) -> None:
        self._scores.setdefault(problem_id, {})[(prm, tuple(steps))] = score

    def drop_problem(self, problem_id: Hashable) -> None:
        self._scores.pop(problem_id, None)

    @property
    def hit_rate(self) -> float:
        lookups = self.hits + self.misses
        return self.hits / lookups if lookups else 0.0

    def __len__(self) -> int:
        return sum(len(scores) for scores in self._scores.values())
