"""Prefix-cache thrash tracking for one model: a listener on its block manager's events.

Every block hash ever computed is remembered. A lookup that misses on a hash computed
before and evicted since is a *thrash event*: an avoidable recompute, caused by memory
pressure (the LRU list, or an elastic pool taking the block away). Its *reuse distance*
is the number of blocks allocated between that hash's computation and the re-miss (for
a hash thrashed more than once, since its latest computation); compared with the
model's pool size it says how much more cache would have kept the block.

An eviction is counted once, at its first re-miss: a sequence whose admission is
refused for lack of blocks looks its prefix up again every step, and those retries are
not further recomputes. A miss on a hash still cached (the chain broke at an earlier,
evicted block) is not counted either: the earlier block's event stands for that prefix.

The per-step timeline (blocks in use / cached-but-free / free per step) is sampled by
the runtime, which knows when a step ends.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from tts_runtime.engine.events import BlockEvent

# Timelines longer than this are thinned (every k-th step) in reports.
MAX_TIMELINE_POINTS = 2000


@dataclass
class Timeline:
    steps: list[int] = field(default_factory=list)
    in_use: list[int] = field(default_factory=list)
    cached: list[int] = field(default_factory=list)  # free but holding a cached prefix
    free: list[int] = field(default_factory=list)  # free and empty

    def record(self, step: int, in_use: int, cached: int, free: int) -> None:
        self.steps.append(step)
        self.in_use.append(in_use)
        self.cached.append(cached)
        self.free.append(free)

    def to_dict(self, max_points: int = MAX_TIMELINE_POINTS) -> dict:
        stride = max(1, -(-len(self.steps) // max_points))
        return {"steps": self.steps[::stride], "in_use": self.in_use[::stride],
                "cached": self.cached[::stride], "free": self.free[::stride], "stride": stride}


@dataclass
class ThrashTracker:
    hits: int = 0
    misses: int = 0
    allocations: int = 0
    evictions: int = 0
    thrash_events: int = 0
    reuse_distances: list[int] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)

    def __post_init__(self) -> None:
        self._computed_at: dict[int, int] = {}  # hash -> allocation count when computed
        self._evicted: set[int] = set()  # computed, evicted, not missed since

    def __call__(self, event: BlockEvent) -> None:
        kind, block_hash = event.kind, event.block_hash
        if kind == "allocate":
            self.allocations += 1
        elif kind == "cached":
            self._computed_at[block_hash] = self.allocations
            self._evicted.discard(block_hash)
        elif kind == "evict":
            self.evictions += 1
            self._evicted.add(block_hash)
        elif kind == "hit":
            self.hits += 1
        elif kind == "miss":
            self.misses += 1
            if block_hash in self._evicted:
                self._evicted.remove(block_hash)
                self.thrash_events += 1
                self.reuse_distances.append(self.allocations - self._computed_at[block_hash])

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    @property
    def thrash_rate(self) -> float:
        """Thrash events per block lookup."""
        return self.thrash_events / self.lookups if self.lookups else 0.0

    def record_step(self, step: int, in_use: int, cached: int, free: int) -> None:
        self.timeline.record(step, in_use, cached, free)

    def summary(self) -> dict:
        distances = self.reuse_distances
        return {
            "lookups": self.lookups, "hits": self.hits, "misses": self.misses,
            "hit_rate": self.hit_rate, "allocations": self.allocations, "evictions": self.evictions,
            "thrash_events": self.thrash_events, "thrash_rate": self.thrash_rate,
            "reuse_distance": {
                "count": len(distances),
                "mean": statistics.fmean(distances) if distances else None,
                "median": statistics.median(distances) if distances else None,
                "p90": _quantile(distances, 0.9), "max": max(distances, default=None),
            },
        }


def _quantile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
