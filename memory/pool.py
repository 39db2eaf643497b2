"""The elastic KV pool: one buffer of KV memory, cut into chunks, each owned by one model.

Design (honest about memory on CPU and GPU alike):

* One flat byte buffer holds the whole KV budget, allocated once. Each model sees all of
  it through its own block-major views (tts_runtime/engine/kv_cache.shared_kv_views):
  its block j lives at byte j x stride, whatever layer count or head shape it has. No
  memory is reserved twice; the two views alias the same bytes.
* The buffer is cut into chunks of `chunk_bytes`, a size both strides divide, so a chunk
  is exactly `blocks_per_chunk` whole blocks in either view. A chunk belongs to one model
  at a time, and only the block ids inside its own chunks are usable by that model's
  block manager.
* Moving a chunk: the donor's block manager gives up the chunk's block ids
  (`remove_free_blocks`, which refuses any block in use; cached-but-free blocks are
  evicted, with an `evict` event); the bytes are zeroed (the receiver reinterprets them,
  and a stale value must never turn into a NaN a masked attention could pick up); the
  receiver's block manager gains its ids for the chunk (`add_blocks`).
* Which chunks go: only chunks with no block in use; among them those holding no cached
  block first, then those whose cached blocks were freed longest ago; ties prefer the
  highest chunk (block managers fill low ids first, so high chunks are the emptiest).

Every move is logged with its reason. This module knows block managers only through
the small protocol below, so it imports nothing from the engine.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterable, Protocol

import torch

from tts_runtime.executor.kv_cache import zeroed_buffer

# A chunk holds at most this many blocks of the larger model: bigger chunks move too
# coarsely, smaller ones waste a partial block per chunk when sizes do not divide.
_MAX_BLOCKS_PER_CHUNK = 8


class BlockPool(Protocol):
    """What the pool needs from a block manager (tts_runtime.engine.block_manager)."""

    def ref_count(self, block_id: int) -> int: ...
    def is_usable(self, block_id: int) -> bool: ...
    def cached_free_blocks(self) -> list[int]: ...
    def add_blocks(self, block_ids: Iterable[int]) -> None: ...
    def remove_free_blocks(self, block_ids: Iterable[int]) -> int: ...


@dataclass(frozen=True)
class MemberLayout:
    block_bytes: int  # bytes of one block's K and V over all layers
    block_stride: int  # bytes from one block to the next (>= block_bytes)
    blocks_per_chunk: int


@dataclass(frozen=True)
class ChunkLayout:
    chunk_bytes: int
    num_chunks: int
    members: dict[str, MemberLayout]

    @classmethod
    def for_blocks(cls, kv_bytes: int, block_bytes: dict[str, int], element_sizes: dict[str, int]) -> ChunkLayout:
        """Chunks of the smallest size every model's blocks tile exactly (their least
        common multiple) when that is at most a few blocks; otherwise a few blocks of the
        larger model, with the other model's blocks padded so that a whole number of
        them tiles the chunk (a view's block stride is uniform, so stride x blocks per
        chunk must be the chunk exactly)."""
        largest = max(block_bytes.values())
        common = math.lcm(*block_bytes.values())
        chunk = common if common <= _MAX_BLOCKS_PER_CHUNK * largest else _MAX_BLOCKS_PER_CHUNK * largest
        members = {}
        for name, size in block_bytes.items():
            elements = chunk // element_sizes[name]
            per_chunk = next(n for n in range(chunk // size, 0, -1) if elements % n == 0)
            members[name] = MemberLayout(size, chunk // per_chunk, per_chunk)
        return cls(chunk, kv_bytes // chunk, members)

    def num_blocks(self, member: str) -> int:
        """Block ids a member's views address: every chunk's worth."""
        return self.num_chunks * self.members[member].blocks_per_chunk

    def blocks_of(self, member: str, chunk: int) -> range:
        per = self.members[member].blocks_per_chunk
        return range(chunk * per, (chunk + 1) * per)

    def to_dict(self) -> dict:
        return {"chunk_bytes": self.chunk_bytes, "num_chunks": self.num_chunks,
                "members": {k: asdict(v) for k, v in self.members.items()}}


@dataclass(frozen=True)
class ChunkMove:
    step: int
    donor: str
    receiver: str
    chunks: tuple[int, ...]
    evicted_blocks: int  # donor's cached blocks forgotten by the move
    reason: str


@dataclass
class ElasticKVPool:
    layout: ChunkLayout
    owners: list[str]  # per chunk
    device: torch.device
    lazy_zeroing: bool = True  # CacheConfig.lazy_kv_zeroing
    moves: list[ChunkMove] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.owners) != self.layout.num_chunks:
            raise ValueError("one owner per chunk")
        self.buffer = zeroed_buffer(self.layout.num_chunks * self.layout.chunk_bytes, self.device, self.lazy_zeroing)
        self._pools: dict[str, BlockPool] = {}
        # The policy asks every step how much each model owns: a count kept as chunks move,
        # not a scan of `owners` (an 80 GB budget is ~10^5 chunks).
        self._chunk_counts = Counter(self.owners)

    @classmethod
    def split(cls, layout: ChunkLayout, first: str, second: str, second_chunks: int,
              device: torch.device, lazy_zeroing: bool = True) -> ElasticKVPool:
        """`second` owns the top `second_chunks` chunks, `first` the rest."""
        owners = [first] * (layout.num_chunks - second_chunks) + [second] * second_chunks
        return cls(layout, owners, device, lazy_zeroing)

    # -- membership ------------------------------------------------------------------
    def attach(self, member: str, pool: BlockPool) -> None:
        self._pools[member] = pool

    def usable_blocks(self, member: str) -> list[int]:
        return [b for chunk in self.chunks_of(member) for b in self.layout.blocks_of(member, chunk)]

    def chunks_of(self, member: str) -> list[int]:
        return [c for c, owner in enumerate(self.owners) if owner == member]

    def num_blocks_of(self, member: str) -> int:
        return self._chunk_counts[member] * self.layout.members[member].blocks_per_chunk

    # -- moving chunks ---------------------------------------------------------------
    def movable_chunks(self, member: str, allow_cached: bool = True) -> list[int]:
        """Chunks `member` could give away now, best candidates first; with
        `allow_cached=False` only chunks holding no cached block (memory it does not use)."""
        pool = self._pools[member]
        recency = {b: rank for rank, b in enumerate(pool.cached_free_blocks())}  # 0 = oldest
        candidates = []
        for chunk in self.chunks_of(member):
            blocks = self.layout.blocks_of(member, chunk)
            if any(pool.ref_count(b) for b in blocks):
                continue
            cached = [recency[b] for b in blocks if b in recency]
            if cached and not allow_cached:
                continue
            candidates.append(((bool(cached), max(cached, default=-1), -chunk), chunk))
        return [chunk for _, chunk in sorted(candidates)]

    def move(self, donor: str, receiver: str, count: int, step: int, reason: str,
             allow_cached: bool = True) -> ChunkMove | None:
        """Move up to `count` free chunks from donor to receiver; None if none could move."""
        chunks = tuple(self.movable_chunks(donor, allow_cached)[:max(count, 0)])
        if not chunks:
            return None
        evicted = 0
        for chunk in chunks:
            evicted += self._pools[donor].remove_free_blocks(self.layout.blocks_of(donor, chunk))
            start = chunk * self.layout.chunk_bytes
            self.buffer[start:start + self.layout.chunk_bytes].zero_()
            self._pools[receiver].add_blocks(self.layout.blocks_of(receiver, chunk))
            self.owners[chunk] = receiver
            self._chunk_counts[donor] -= 1
            self._chunk_counts[receiver] += 1
        record = ChunkMove(step, donor, receiver, chunks, evicted, reason)
        self.moves.append(record)
        return record
