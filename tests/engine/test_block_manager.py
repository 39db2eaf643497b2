"""Prefix caching, LRU eviction, revival and events of the real block manager."""

from __future__ import annotations

from tts_runtime.engine.events import BlockEvent
from tts_runtime.engine.block_manager import ROOT_HASH, BlockManager, chain_hash


def _fill(bm: BlockManager, tokens: list[int]) -> list[int]:
    """Allocate and register blocks for `tokens` the way the engine does after a forward."""
    n = len(tokens) // bm.block_size
    ids = bm.allocate(n)
    parent = ROOT_HASH
    for k, block_id in enumerate(ids):
        parent = bm.register_full_block(block_id, parent, tuple(tokens[k * 4:(k + 1) * 4]))
    return ids


def test_hit_shares_blocks_and_counts_references():
    bm = BlockManager(num_blocks=8, block_size=4)
    tokens = list(range(12))
    ids = _fill(bm, tokens)
    hit, hashes = bm.acquire_cached_prefix(tokens + [99], max_blocks=3)
    assert hit == ids and len(hashes) == 3
    assert all(bm.ref_count(b) == 2 for b in ids)
    assert bm.stats.prefix_hits == 3 and bm.stats.prefix_queries == 3


def test_chain_hash_depends_on_parent():
    bm = BlockManager(num_blocks=8, block_size=4)
    _fill(bm, [1, 2, 3, 4, 5, 6, 7, 8])
    # Same second block, different first block: no hit on either.
    hit, _ = bm.acquire_cached_prefix([9, 9, 9, 9, 5, 6, 7, 8, 0], max_blocks=2)
    assert hit == []


def test_freed_blocks_stay_cached_and_revive_then_lru_evicts_oldest():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = _fill(bm, [1, 2, 3, 4])
    b = _fill(bm, [5, 6, 7, 8])
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 4 and bm.num_cached_free_blocks == 2
    hit, _ = bm.acquire_cached_prefix([1, 2, 3, 4, 0], max_blocks=1)  # revive a
    assert hit == a and bm.ref_count(a[0]) == 1
    bm.free(hit)  # a is now the most recently freed
    bm.allocate(2)  # the two never-cached blocks
    bm.allocate(1)  # must evict b (least recently freed), not a
    assert bm.block_hash(b[0]) is None
    assert bm.acquire_cached_prefix([1, 2, 3, 4, 0], max_blocks=1)[0] == a
    assert bm.stats.evictions == 1


def test_hash_collision_is_rejected_by_token_check():
    bm = BlockManager(num_blocks=4, block_size=4)
    ids = _fill(bm, [1, 2, 3, -1])
    bm.free(ids)
    # A real collision: CPython hashes -1 and -2 alike, so these blocks share a chained hash.
    stored, other = (1, 2, 3, -1), (1, 2, 3, -2)
    assert chain_hash(ROOT_HASH, stored) == chain_hash(ROOT_HASH, other)
    assert bm.acquire_cached_prefix([*other, 0], max_blocks=1)[0] == []
    # The stored block keeps its hash and still serves its own tokens.
    assert bm.block_hash(ids[0]) == chain_hash(ROOT_HASH, stored)
    assert bm.acquire_cached_prefix([*stored, 0], max_blocks=1)[0] == ids


def test_events_flow_to_listeners():
    events: list[BlockEvent] = []
    bm = BlockManager(num_blocks=2, block_size=4, listeners=[events.append])
    ids = _fill(bm, [1, 2, 3, 4])
    bm.free(ids)
    bm.acquire_cached_prefix([1, 2, 3, 4, 5], max_blocks=1)
    bm.acquire_cached_prefix([7, 7, 7, 7, 5], max_blocks=1)
    kinds = [e.kind for e in events]
    assert kinds == ["allocate", "cached", "free", "hit", "miss"]


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    ids = _fill(bm, [1, 2, 3, 4])
    bm.free(ids)
    assert bm.acquire_cached_prefix([1, 2, 3, 4, 5], max_blocks=1) == ([], [])
    assert bm.num_cached_free_blocks == 0
