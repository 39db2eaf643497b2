"""The host KV tier (Seesaw's tiered KV buffering): the bookkeeping of a host-memory copy
of cached prefix blocks below an engine's device pool.

When the device pool's LRU list evicts a cached block, the block manager `save`s it here
instead of losing it; a later prefix lookup that misses the device pool but finds the
block here `load`s it into a freshly allocated device block, re-registered under the same
hash, instead of recomputing it. The tier is inclusive: a block swapped back in keeps its
host copy (its K/V never change), so evicting it again costs no copy. LRU inside the tier;
a slot that a queued swap-in reads is pinned until the copies ran, so it is never reused
under it.

Nothing is copied here: saves and loads queue (device block, host slot) pairs, and
`take_plan` hands one step's whole batch to the device side (executor/kv_swap.py), which
runs the swap-outs before the swap-ins. A later save into a reused slot, or a later load
into a reused block, replaces the earlier queued copy (its data is gone anyway).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tts_runtime.executor.kv_swap import SwapPlan


@dataclass
class _Entry:
    slot: int
    parent_hash: int
    tokens: tuple[int, ...]


@dataclass
class HostTierStats:
    saved: int = 0  # blocks copied device -> host
    loaded: int = 0  # blocks copied host -> device (lookups and prefetches)
    dropped: int = 0  # blocks the tier's LRU forgot
    rejected: int = 0  # evicted blocks not saved: every slot pinned by a queued load


class HostTier:
    def __init__(self, num_slots: int, block_bytes: int) -> None:
        self.num_slots = num_slots
        self.block_bytes = block_bytes  # K and V of one block over all layers
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # LRU first
        self._free_slots = list(range(num_slots - 1, -1, -1))  # popped lowest first
        self._pinned: dict[int, int] = {}  # slot -> queued loads reading it
        self._outs: dict[int, int] = {}  # slot -> device block
        self._ins: dict[int, int] = {}  # device block -> slot
        self.stats = HostTierStats()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._entries

    def holds(self, block_hash: int, parent_hash: int, tokens: tuple[int, ...]) -> bool:
        """The block is here with exactly these tokens and parent (no silent collision)."""
        entry = self._entries.get(block_hash)
        return entry is not None and entry.parent_hash == parent_hash and entry.tokens == tokens

    def save(self, block_hash: int, parent_hash: int, tokens: tuple[int, ...], block_id: int) -> tuple[bool, list[int]]:
        """An evicted device block: queue its copy out. Returns (copied, hashes the tier
        dropped to make room); a block already here is only marked recently used."""
        if block_hash in self._entries:
            self._entries.move_to_end(block_hash)
            return False, []
        dropped = []
        if not self._free_slots:
            victim = next((h for h, e in self._entries.items() if e.slot not in self._pinned), None)
            if victim is None:
                self.stats.rejected += 1
                return False, []
            self._free_slots.append(self._entries.pop(victim).slot)
            self.stats.dropped += 1
            dropped.append(victim)
        slot = self._free_slots.pop()
        self._entries[block_hash] = _Entry(slot, parent_hash, tokens)
        self._outs[slot] = block_id
        self.stats.saved += 1
        return True, dropped

    def pin(self, block_hash: int) -> None:
        """Keep a block's slot while the caller allocates the device block to load it into
        (that allocation may evict, and so save, other blocks)."""
        entry = self._entries[block_hash]
        self._entries.move_to_end(block_hash)
        self._pinned[entry.slot] = self._pinned.get(entry.slot, 0) + 1

    def load(self, block_hash: int, block_id: int) -> None:
        """Queue the copy of a pinned block into device block `block_id`; the slot stays
        pinned until `take_plan`."""
        self._ins[block_id] = self._entries[block_hash].slot
        self.stats.loaded += 1

    def take_plan(self, overlap: bool = False) -> SwapPlan:
        """The queued copies, as one batch; clears the queue and the pins."""
        plan = SwapPlan(list(self._outs.values()), list(self._outs), list(self._ins.values()), list(self._ins),
                        overlap)
        self._outs.clear()
        self._ins.clear()
        self._pinned.clear()
        return plan
