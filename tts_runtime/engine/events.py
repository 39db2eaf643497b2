"""Block events: what the engine's block manager tells listeners (thrash tracker, elastic pool)."""

from __future__ import annotations

from typing import Callable, Literal, NamedTuple

# hit: full prompt blocks one lookup found in the prefix cache (`blocks` of them, one event
# a lookup); miss: one block it did not find; allocate: blocks one call took from the free
# pool (`blocks`); cached: a block became full and its hash was registered; evict: a cached
# free block was reused for other tokens and its hash forgotten.
# Host KV tier (engine/host_tier.py): swap_out: an evicted block's K/V were copied to the
# tier; swap_in: a tier block was copied back into a device block (a lookup's or the
# prefetcher's); host_hit: a lookup was served by the tier (swapped in now, or earlier by
# the prefetcher) instead of a recompute; host_drop: the tier's LRU forgot a block;
# swap_time: one batch of copies finished (`seconds`, of which `hidden_seconds` overlapped
# a forward).
BlockEventKind = Literal["hit", "miss", "allocate", "cached", "evict",
                         "swap_out", "swap_in", "host_hit", "host_drop", "swap_time"]


class BlockEvent(NamedTuple):
    """Immutable; a named tuple rather than a frozen dataclass, which takes ~1 us to build
    against ~0.3 us. Hits and allocations come one event per call, not per block: per block
    they were 1.5 us each of a PRM step's admissions, whose requests hit ~40 blocks each."""

    kind: BlockEventKind
    block_id: int  # -1 for an event of several blocks (hit, allocate)
    # Chained hash of the block's tokens; None for a block not yet full (never cacheable).
    # A hit's: the last block it found.
    block_hash: int | None
    # Engine step counter when the event happened (for timelines).
    step: int
    # Host tier only: bytes copied (swap_out, swap_in), tokens not recomputed (host_hit),
    # copy time (swap_time).
    nbytes: int = 0
    tokens: int = 0
    blocks: int = 1  # hit, allocate
    seconds: float = 0.0
    hidden_seconds: float = 0.0


BlockEventListener = Callable[[BlockEvent], None]
