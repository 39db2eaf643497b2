"""Paged KV block allocation with chained-hash prefix caching.

A full block is identified by hash((parent block hash, its tokens)), so equal hashes mean
equal whole prefixes. A hit is accepted only after comparing the stored tokens and parent
hash (no silent collision). Blocks whose last user let go keep their hash in an LRU list
and are revived by a hit; allocation takes never-cached blocks first, then evicts the
least recently freed cached block.

Never-cached free blocks are handed out lowest id first, so a pool's blocks in use pack
into its low ids; an elastic KV pool (memory/pool.py) can then take whole free chunks off
the top with `remove_free_blocks` and hand them to the other model with `add_blocks`.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from tts_runtime.engine.events import BlockEvent, BlockEventKind, BlockEventListener

ROOT_HASH = 0


def chain_hash(parent_hash: int, tokens: tuple[int, ...]) -> int:
    return hash((parent_hash, tokens))


@dataclass
class _Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    parent_hash: int = ROOT_HASH
    tokens: tuple[int, ...] = ()


@dataclass
class BlockStats:
    prefix_queries: int = 0  # full blocks looked up
    prefix_hits: int = 0
    allocations: int = 0
    evictions: int = 0


@dataclass
class BlockManager:
    num_blocks: int  # block ids addressed (the KV tensors' first dimension)
    block_size: int
    enable_prefix_caching: bool = True
    listeners: list[BlockEventListener] = field(default_factory=list)
    step: int = 0
    # Ids this manager may use at start (None: all). An elastic pool adds and removes ids.
    usable_blocks: Iterable[int] | None = None

    def __post_init__(self) -> None:
        self._blocks = [_Block(i) for i in range(self.num_blocks)]
        usable = range(self.num_blocks) if self.usable_blocks is None else self.usable_blocks
        self._usable: set[int] = set(usable)
        self._free_uncached: list[int] = sorted(self._usable)  # a min-heap of ids
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._by_hash: dict[int, int] = {}
        self.stats = BlockStats()

    # -- queries ---------------------------------------------------------------------
    @property
    def num_usable_blocks(self) -> int:
        return len(self._usable)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        return len(self._usable) - self.num_free_blocks

    def is_usable(self, block_id: int) -> bool:
        return block_id in self._usable

    def cached_free_blocks(self) -> list[int]:
        """Free blocks that still hold a cached prefix, least recently freed first."""
        return list(self._free_cached)

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def block_hash(self, block_id: int) -> int | None:
        return self._blocks[block_id].block_hash

    # -- events ----------------------------------------------------------------------
    def _emit(self, kind: BlockEventKind, block_id: int, block_hash: int | None) -> None:
        if self.listeners:
            event = BlockEvent(kind, block_id, block_hash, self.step)
            for listener in self.listeners:
                listener(event)

    # -- prefix cache ----------------------------------------------------------------
    def full_block_hashes(self, token_ids: list[int], num_blocks: int) -> list[int]:
        hashes, parent = [], ROOT_HASH
        bs = self.block_size
        for i in range(num_blocks):
            parent = chain_hash(parent, tuple(token_ids[i * bs: (i + 1) * bs]))
            hashes.append(parent)
        return hashes

    def acquire_cached_prefix(self, token_ids: list[int], max_blocks: int) -> tuple[list[int], list[int]]:
        """Take references on the longest cached run of the first `max_blocks` full blocks.

        Returns (block ids hit, chained hashes of all `max_blocks` blocks)."""
        if not self.enable_prefix_caching or max_blocks <= 0:
            return [], []
        hashes = self.full_block_hashes(token_ids, max_blocks)
        hit_ids: list[int] = []
        bs = self.block_size
        for i, h in enumerate(hashes):
            block_id = self._by_hash.get(h)
            block = self._blocks[block_id] if block_id is not None else None
            parent = hashes[i - 1] if i else ROOT_HASH
            if block is None or block.parent_hash != parent or block.tokens != tuple(token_ids[i * bs:(i + 1) * bs]):
                break
            if block.ref_count == 0:
                del self._free_cached[block_id]
            block.ref_count += 1
            hit_ids.append(block_id)
            self._emit("hit", block_id, h)
        for h in hashes[len(hit_ids):]:
            self._emit("miss", -1, h)
        self.stats.prefix_queries += len(hashes)
        self.stats.prefix_hits += len(hit_ids)
        return hit_ids, hashes

    def num_cached_prefix_blocks(self, block_hashes: list[int]) -> int:
        """How many leading blocks of a chain (`full_block_hashes`) are cached now. Read-only:
        no reference taken, no event, no stats; a scheduler plans with it every step, so it
        trusts the chained hash (acquire_cached_prefix verifies the tokens)."""
        if not self.enable_prefix_caching:
            return 0
        hits = 0
        for h in block_hashes:
            if h not in self._by_hash:
                break
            hits += 1
        return hits

    def register_full_block(self, block_id: int, parent_hash: int, tokens: tuple[int, ...]) -> int:
        """Record a block that just became full; returns its chained hash."""
        h = chain_hash(parent_hash, tokens)
        if not self.enable_prefix_caching:
            return h
        block = self._blocks[block_id]
        if h in self._by_hash:  # identical content computed concurrently: keep the first copy
            return h
        block.block_hash, block.parent_hash, block.tokens = h, parent_hash, tokens
        self._by_hash[h] = block_id
        self._emit("cached", block_id, h)
        return h

    # -- allocation ------------------------------------------------------------------
    def can_allocate(self, n: int) -> bool:
        return self.num_free_blocks >= n

    def allocate(self, n: int) -> list[int] | None:
        if n > self.num_free_blocks:
            return None
        out = []
        for _ in range(n):
            if self._free_uncached:
                block_id = heapq.heappop(self._free_uncached)
            else:
                block_id, _ = self._free_cached.popitem(last=False)
                self._evict(block_id)
            block = self._blocks[block_id]
            block.ref_count = 1
            out.append(block_id)
            self._emit("allocate", block_id, None)
        self.stats.allocations += n
        return out

    def _evict(self, block_id: int) -> None:
        block = self._blocks[block_id]
        self._emit("evict", block_id, block.block_hash)
        del self._by_hash[block.block_hash]
        block.block_hash, block.parent_hash, block.tokens = None, ROOT_HASH, ()
        self.stats.evictions += 1

    def share(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            self._blocks[block_id].ref_count += 1

    def free(self, block_ids: list[int]) -> None:
        # Tail blocks first, so the LRU list evicts a sequence's end before its shared prefix.
        for block_id in reversed(block_ids):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count > 0:
                continue
            if block.block_hash is not None:
                self._free_cached[block_id] = None
            else:
                heapq.heappush(self._free_uncached, block_id)
            self._emit("free", block_id, block.block_hash)

    def evict_cached(self, n: int) -> int:
        """Forget up to n cached free blocks (LRU first); returns how many."""
        count = 0
        while count < n and self._free_cached:
            block_id, _ = self._free_cached.popitem(last=False)
            self._evict(block_id)
            heapq.heappush(self._free_uncached, block_id)
            count += 1
        return count

    # -- resizing (elastic KV pool) --------------------------------------------------
    def add_blocks(self, block_ids: Iterable[int]) -> None:
        """Make unusable ids usable: they join the never-cached free blocks."""
        for block_id in block_ids:
            if block_id in self._usable:
                raise ValueError(f"block {block_id} is already in this pool")
            self._usable.add(block_id)
            heapq.heappush(self._free_uncached, block_id)

    def remove_free_blocks(self, block_ids: Iterable[int]) -> int:
        """Take free blocks out of use; cached ones are evicted first (an `evict` event each).

        Refuses, changing nothing, if any block is in use or not in this pool: a block a
        sequence references never leaves. Returns how many cached blocks were evicted."""
        ids = list(block_ids)
        for block_id in ids:
            if block_id not in self._usable:
                raise ValueError(f"block {block_id} is not in this pool")
            if self._blocks[block_id].ref_count:
                raise ValueError(f"block {block_id} is in use: only free blocks can leave a pool")
        evicted = 0
        for block_id in ids:
            if block_id in self._free_cached:
                del self._free_cached[block_id]
                self._evict(block_id)
                evicted += 1
            self._usable.discard(block_id)
        leaving = set(ids)
        self._free_uncached = [b for b in self._free_uncached if b not in leaving]
        heapq.heapify(self._free_uncached)
        return evicted
