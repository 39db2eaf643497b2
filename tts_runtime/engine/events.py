"""Block events: what the engine's block manager tells listeners (thrash tracker, elastic pool)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

# hit/miss: a full prompt block looked up in the prefix cache; allocate: a block taken
# from the free pool; cached: a block became full and its hash was registered; free: a
# block's last user let go (it stays cached if it has a hash); evict: a cached free block
# was reused for other tokens and its hash forgotten.
BlockEventKind = Literal["hit", "miss", "allocate", "cached", "free", "evict"]


@dataclass(frozen=True)
class BlockEvent:
    kind: BlockEventKind
    block_id: int
    # Chained hash of the block's tokens; None for a block not yet full (never cacheable).
    block_hash: int | None
    # Engine step counter when the event happened (for timelines).
    step: int


BlockEventListener = Callable[[BlockEvent], None]
