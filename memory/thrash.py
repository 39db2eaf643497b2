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

With a host KV tier (tts_runtime/engine/host_tier.py) an evicted block may come back
from host memory instead: such a lookup is a *host hit*, counted apart from device hits
and never a thrash event (nothing is recomputed); thrash events are then the recomputes
the tier could not prevent. The tracker also sums what the tier moved: blocks and bytes
swapped out and in, tokens not recomputed, copy seconds and the part hidden behind a
forward (CUDA; on CPU the copies are synchronous, nothing is hidden).

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


_HOST_KINDS = ("swap_out", "swap_in", "host_hit", "host_drop", "swap_time")


@dataclass
class HostTierCounts:
    """What the host KV tier did for one model (all zero with the tier off)."""

    hits: int = 0  # lookups served by the tier instead of a recompute
    tokens_not_recomputed: int = 0
    blocks_out: int = 0
    blocks_in: int = 0  # lookups' and prefetches' swap-ins
    bytes_out: int = 0
    bytes_in: int = 0
    dropped: int = 0  # blocks the tier's LRU forgot
    swap_seconds: float = 0.0
    hidden_seconds: float = 0.0  # swap time overlapped with a forward (CUDA)

    def record(self, event: BlockEvent) -> None:
        kind = event.kind
        if kind == "host_hit":
            self.hits += 1
            self.tokens_not_recomputed += event.tokens
        elif kind == "swap_out":
            self.blocks_out += 1
            self.bytes_out += event.nbytes
        elif kind == "swap_in":
            self.blocks_in += 1
            self.bytes_in += event.nbytes
        elif kind == "host_drop":
            self.dropped += 1
        elif kind == "swap_time":
            self.swap_seconds += event.seconds
            self.hidden_seconds += event.hidden_seconds

    def summary(self, lookups: int) -> dict:
        return {
            "hits": self.hits, "hit_rate": self.hits / lookups if lookups else 0.0,
            "tokens_not_recomputed": self.tokens_not_recomputed,
            "blocks_out": self.blocks_out, "blocks_in": self.blocks_in,
            "bytes_out": self.bytes_out, "bytes_in": self.bytes_in, "dropped": self.dropped,
            "swap_seconds": self.swap_seconds, "hidden_seconds": self.hidden_seconds,
            "hidden_share": self.hidden_seconds / self.swap_seconds if self.swap_seconds else 0.0,
        }


@dataclass
class ThrashTracker:
    hits: int = 0
    misses: int = 0
    allocations: int = 0
    evictions: int = 0
    thrash_events: int = 0
    reuse_distances: list[int] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)
    host: HostTierCounts = field(default_factory=HostTierCounts)

    def __post_init__(self) -> None:
        self._computed_at: dict[int, int] = {}  # hash -> allocation count when computed
        self._evicted: set[int] = set()  # computed, evicted, not missed since

    def __call__(self, event: BlockEvent) -> None:
        kind, block_hash = event.kind, event.block_hash
        if kind == "allocate":
            self.allocations += event.blocks
        elif kind == "cached":
            self._computed_at[block_hash] = self.allocations
            self._evicted.discard(block_hash)
        elif kind == "evict":
            self.evictions += 1
            self._evicted.add(block_hash)
        elif kind == "hit":
            self.hits += event.blocks
        elif kind in _HOST_KINDS:
            self.host.record(event)
            if kind in ("host_hit", "swap_in"):  # back on the device: a later eviction is new
                self._evicted.discard(block_hash)
        elif kind == "miss":
            self.misses += 1
            if block_hash in self._evicted:
                self._evicted.remove(block_hash)
                self.thrash_events += 1
                self.reuse_distances.append(self.allocations - self._computed_at[block_hash])

    @property
    def lookups(self) -> int:
        return self.hits + self.host.hits + self.misses

    @property
    def hit_rate(self) -> float:
        """Lookups not recomputed: device hits and host-tier hits."""
        return (self.hits + self.host.hits) / self.lookups if self.lookups else 0.0

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
            "host_tier": self.host.summary(self.lookups),
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
