"""Paged KV block allocation with chained-hash prefix caching.

A full block is identified by hash((parent block hash, its tokens)), so equal hashes mean
equal whole prefixes. A hit is accepted only after comparing the stored tokens and parent
hash (no silent collision). Blocks whose last user let go keep their hash in an LRU list
and are revived by a hit; allocation takes never-cached blocks first, then evicts the
least recently freed cached block.

Never-cached free blocks are handed out lowest id first, so a pool's blocks in use pack
into its low ids; an elastic KV pool (memory/pool.py) can then take whole free chunks off
the top with `remove_free_blocks` and hand them to the other model with `add_blocks`.

With a host tier (engine/host_tier.py) a block the LRU list evicts for reuse is saved
there, and a lookup continues past the device hits into the tier: each block found there
is loaded into a newly allocated device block under the same hash (a `host_hit`, its
tokens not recomputed). `prefetch` does the same ahead of a lookup, leaving the loaded
blocks cached-but-free at the recent end of the LRU list; the lookup that uses one counts
it as a host hit. Blocks dropped deliberately (`evict_cached`, an elastic pool taking a
chunk, whose bytes are zeroed at once) are not saved.

With `reuse_partial_blocks`, a sequence's last, partial block outlives it as a *tail*: its
computed tokens are kept under its parent's chained hash (`keep_tail`), the block waits in
the LRU list like a cached full block, and a later sequence that continues the same prefix
takes it over (`take_tail`) instead of recomputing up to block_size - 1 tokens. A search
continues every beam from the sequence that generated its last step, so without tails each
generator step and PRM request recomputes half a block on average. A tail has one taker: it
leaves the cache when taken (it is written past its tokens from then on) and is never saved
to the host tier.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from tts_runtime.engine.events import BlockEvent, BlockEventKind, BlockEventListener
from tts_runtime.engine.host_tier import HostTier
from tts_runtime.executor.kv_swap import SwapTiming

ROOT_HASH = 0


def chain_hash(parent_hash: int, tokens: tuple[int, ...]) -> int:
    return hash((parent_hash, tokens))


def _common_prefix(a: tuple[int, ...], b: list[int]) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


@dataclass
class _Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    parent_hash: int = ROOT_HASH
    tokens: tuple[int, ...] = ()
    is_tail: bool = False  # a cached partial block: `tokens` are its first, computed slots


@dataclass
class BlockStats:
    prefix_queries: int = 0  # full blocks looked up
    prefix_hits: int = 0
    allocations: int = 0
    evictions: int = 0
    host_hits: int = 0  # lookups served by the host tier (swapped in, or prefetched)
    tail_hits: int = 0  # partial blocks taken over instead of recomputed
    tail_tokens: int = 0  # tokens those tails saved


@dataclass
class BlockManager:
    num_blocks: int  # block ids addressed (the KV tensors' first dimension)
    block_size: int
    enable_prefix_caching: bool = True
    listeners: list[BlockEventListener] = field(default_factory=list)
    step: int = 0
    # Ids this manager may use at start (None: all). An elastic pool adds and removes ids.
    usable_blocks: Iterable[int] | None = None
    # Host KV tier below the device pool (None: evicted blocks are lost).
    host_tier: HostTier | None = None
    reuse_partial_blocks: bool = True

    def __post_init__(self) -> None:
        self._blocks = [_Block(i) for i in range(self.num_blocks)]
        usable = range(self.num_blocks) if self.usable_blocks is None else self.usable_blocks
        self._usable: set[int] = set(usable)
        self._free_uncached: list[int] = sorted(self._usable)  # a min-heap of ids
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # LRU first
        self._by_hash: dict[int, int] = {}
        self._prefetched: set[int] = set()  # hashes the prefetcher loaded, not looked up since
        self._tails: dict[int, set[int]] = {}  # parent chained hash -> cached tail block ids
        self.stats = BlockStats()
        # Bumped whenever a hash enters or leaves the device cache or the host tier: a
        # read-only lookup (`num_cached_prefix_blocks`) answered at one version holds until
        # the next bump, so a scheduler may reuse it instead of walking the chain again.
        self.cache_version = 0

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

    def is_held(self, block_hash: int) -> bool:
        """A device block with this chained hash has a reference on it (a running sequence
        uses it): one more sequence sharing it takes no new block."""
        block_id = self._by_hash.get(block_hash)
        return block_id is not None and self._blocks[block_id].ref_count > 0

    # -- events ----------------------------------------------------------------------
    def _emit(self, kind: BlockEventKind, block_id: int, block_hash: int | None, **extra: int | float) -> None:
        if self.listeners:
            event = BlockEvent(kind, block_id, block_hash, self.step, **extra)
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

    def acquire_cached_prefix(self, token_ids: list[int], max_blocks: int,
                              hashes: list[int] | None = None) -> tuple[list[int], list[int]]:
        """Take references on the longest cached run of the first `max_blocks` full blocks;
        `hashes`, where the caller has them already, are those blocks' chained hashes.

        Returns (block ids hit, chained hashes of all `max_blocks` blocks)."""
        if not self.enable_prefix_caching or max_blocks <= 0:
            return [], []
        if hashes is None:
            hashes = self.full_block_hashes(token_ids, max_blocks)
        hit_ids = self._reference_device_run(token_ids, hashes)
        if self.host_tier is not None:
            self._load_host_run(token_ids, hashes, hit_ids)
        for h in hashes[len(hit_ids):]:
            self._emit("miss", -1, h)
        self.stats.prefix_queries += len(hashes)
        return hit_ids, hashes

    def _reference_device_run(self, token_ids: list[int], hashes: list[int]) -> list[int]:
        """References the cached blocks that match the prefix from its start, up to the first
        block that is not on the device (or whose tokens or parent differ: a hash collision)."""
        hit_ids: list[int] = []
        bs = self.block_size
        device_hits = 0
        parent = ROOT_HASH
        for i, h in enumerate(hashes):
            block_id = self._by_hash.get(h)
            if block_id is None:
                break
            block = self._blocks[block_id]
            if block.parent_hash != parent or block.tokens != tuple(token_ids[i * bs:(i + 1) * bs]):
                break
            parent = h
            if block.ref_count == 0:
                del self._free_cached[block_id]
            block.ref_count += 1
            hit_ids.append(block_id)
            if self._prefetched and h in self._prefetched:
                self._prefetched.discard(h)
                self._host_hit(block_id, h)
            else:
                device_hits += 1
        if device_hits:
            self.stats.prefix_hits += device_hits
            self._emit("hit", -1, parent, blocks=device_hits)
        return hit_ids

    def _load_host_run(self, token_ids: list[int], hashes: list[int], hit_ids: list[int]) -> None:
        """Extends the device run in `hit_ids` with the blocks that follow it in the host tier."""
        bs = self.block_size
        while len(hit_ids) < len(hashes):
            i = len(hit_ids)
            block_id = self._load_from_host(hashes[i], hashes[i - 1] if i else ROOT_HASH,
                                            tuple(token_ids[i * bs:(i + 1) * bs]), reserve=0)
            if block_id is None:
                break
            hit_ids.append(block_id)
            self._host_hit(block_id, hashes[i])

    def _host_hit(self, block_id: int, block_hash: int) -> None:
        self.stats.host_hits += 1
        self._emit("host_hit", block_id, block_hash, tokens=self.block_size)

    def _load_from_host(self, block_hash: int, parent_hash: int, tokens: tuple[int, ...], reserve: int) -> int | None:
        """A device block (one reference) holding the tier's copy of this block, registered
        under its hash; None if the tier lacks it or the pool cannot spare a block beyond
        `reserve` free ones."""
        tier = self.host_tier
        if (block_hash in self._by_hash or not tier.holds(block_hash, parent_hash, tokens)
                or self.num_free_blocks <= reserve):
            return None
        tier.pin(block_hash)
        block_id = self.allocate(1)[0]
        tier.load(block_hash, block_id)
        block = self._blocks[block_id]
        block.block_hash, block.parent_hash, block.tokens = block_hash, parent_hash, tokens
        self._by_hash[block_hash] = block_id
        self.cache_version += 1
        self._emit("swap_in", block_id, block_hash, nbytes=tier.block_bytes)
        return block_id

    def prefetch(self, token_ids: list[int], block_hashes: list[int], reserve: int) -> int:
        """Load the tier's blocks that continue this chain's device hits into free device
        blocks, keeping at least `reserve` blocks free; they stay cached-but-free (most
        recently used) for the lookup to come. Returns how many were loaded."""
        if self.host_tier is None:
            return 0
        bs, loaded = self.block_size, []
        chain = {self._by_hash[h] for h in block_hashes if h in self._by_hash}
        for block_id in chain & self._free_cached.keys():  # most recent: evicted after other blocks
            self._free_cached.move_to_end(block_id)
        for i, h in enumerate(block_hashes):
            if h in self._by_hash:
                continue
            # Never evict this chain's own device blocks to make room for its next one.
            if not self._free_uncached and (not self._free_cached or next(iter(self._free_cached)) in chain):
                break
            block_id = self._load_from_host(h, block_hashes[i - 1] if i else ROOT_HASH,
                                            tuple(token_ids[i * bs:(i + 1) * bs]), reserve)
            if block_id is None:
                break
            self._prefetched.add(h)
            loaded.append(block_id)
        self.free(loaded)
        return len(loaded)

    def record_swap_times(self, timings: list[SwapTiming]) -> None:
        for timing in timings:
            self._emit("swap_time", -1, None, seconds=timing.seconds, hidden_seconds=timing.hidden_seconds)

    def num_cached_prefix_blocks(self, block_hashes: list[int]) -> int:
        """How many leading blocks of a chain (`full_block_hashes`) are cached now, on the
        device or in the host tier (either way not recomputed). Read-only:
        no reference taken, no event, no stats; a scheduler plans with it every step, so it
        trusts the chained hash (acquire_cached_prefix verifies the tokens)."""
        if not self.enable_prefix_caching:
            return 0
        hits, tier = 0, self.host_tier
        for h in block_hashes:
            if h not in self._by_hash and (tier is None or h not in tier):
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
        self.cache_version += 1
        self._emit("cached", block_id, h)
        return h

    # -- tails (cached partial blocks) --------------------------------------------------
    def keep_tail(self, block_id: int, parent_hash: int, tokens: tuple[int, ...]) -> None:
        """Keep this partial block's first len(tokens) slots for a sequence that continues
        `parent_hash`'s prefix with `tokens`, once its last user frees it."""
        block = self._blocks[block_id]
        if (not (self.enable_prefix_caching and self.reuse_partial_blocks) or not tokens
                or block.block_hash is not None or block.is_tail or block.ref_count != 1):
            return
        block.is_tail, block.parent_hash, block.tokens = True, parent_hash, tokens
        self._tails.setdefault(parent_hash, set()).add(block_id)

    def take_tail(self, parent_hash: int, token_ids: list[int], start: int, max_tokens: int) -> tuple[int, int] | None:
        """The cached tail under `parent_hash` sharing the most leading tokens with
        token_ids[start:] (at most `max_tokens`), taken over by the caller (one reference):
        (block id, tokens it holds), or None."""
        best, best_len = None, 0
        wanted = token_ids[start:start + max_tokens]
        for block_id in self._tails.get(parent_hash, ()):
            common = _common_prefix(self._blocks[block_id].tokens, wanted)
            if common > best_len:
                best, best_len = block_id, common
        if best is None:
            return None
        block = self._blocks[best]
        if block.ref_count == 0:
            del self._free_cached[best]
        self._forget_tail(block)
        block.ref_count += 1
        self.stats.tail_hits += 1
        self.stats.tail_tokens += best_len
        return best, best_len

    def _forget_tail(self, block: _Block) -> None:
        tails = self._tails[block.parent_hash]
        tails.discard(block.block_id)
        if not tails:
            del self._tails[block.parent_hash]
        block.is_tail, block.parent_hash, block.tokens = False, ROOT_HASH, ()

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
                self._evict(block_id, to_host=True)
            self._blocks[block_id].ref_count = 1
            out.append(block_id)
        if n:
            self._emit("allocate", -1, None, blocks=n)
        self.stats.allocations += n
        return out

    def _evict(self, block_id: int, to_host: bool = False) -> None:
        """Forget a cached free block; `to_host`: it is being reused, save it to the tier."""
        block = self._blocks[block_id]
        if block.is_tail:  # no hash: nothing a lookup, the host tier or a listener knows of
            self._forget_tail(block)
            return
        self._emit("evict", block_id, block.block_hash)
        self._prefetched.discard(block.block_hash)
        if to_host and self.host_tier is not None:
            copied, dropped = self.host_tier.save(block.block_hash, block.parent_hash, block.tokens, block_id)
            for h in dropped:
                self._emit("host_drop", -1, h)
            if copied:
                self._emit("swap_out", block_id, block.block_hash, nbytes=self.host_tier.block_bytes)
        del self._by_hash[block.block_hash]
        self.cache_version += 1
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
            if block.block_hash is not None or block.is_tail:
                self._free_cached[block_id] = None
            else:
                heapq.heappush(self._free_uncached, block_id)

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
