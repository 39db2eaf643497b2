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
    assert [e.kind for e in events] == ["allocate", "cached", "hit", "miss"]
    # Hits and allocations: one event per call, counting its blocks.
    del events[:]
    bm = BlockManager(num_blocks=2, block_size=4, listeners=[events.append])
    two = _fill(bm, [1, 2, 3, 4, 5, 6, 7, 8])
    bm.free(two)
    bm.acquire_cached_prefix([1, 2, 3, 4, 5, 6, 7, 8, 9], max_blocks=2)
    assert [(e.kind, e.blocks) for e in events if e.kind in ("allocate", "hit")] == [("allocate", 2), ("hit", 2)]


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    ids = _fill(bm, [1, 2, 3, 4])
    bm.free(ids)
    assert bm.acquire_cached_prefix([1, 2, 3, 4, 5], max_blocks=1) == ([], [])
    assert bm.num_cached_free_blocks == 0


def _sequence_with_tail(bm: BlockManager, tokens: list[int]) -> tuple[list[int], int, int]:
    """A sequence's blocks after computing `tokens` (one partial last block), kept as a tail
    and freed: (full block ids, tail block id, the full blocks' last chained hash)."""
    full = _fill(bm, tokens)
    parent = bm.full_block_hashes(tokens, len(full))[-1] if full else ROOT_HASH
    tail = bm.allocate(1)[0]
    bm.keep_tail(tail, parent, tuple(tokens[len(full) * bm.block_size:]))
    bm.free(full + [tail])
    return full, tail, parent


def test_a_freed_tail_is_taken_over_once_by_a_sequence_that_continues_it():
    bm = BlockManager(num_blocks=8, block_size=4)
    full, tail, parent = _sequence_with_tail(bm, [1, 2, 3, 4, 5, 6, 7])
    assert bm.num_cached_free_blocks == 2  # the full block and the tail
    continued = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    hit, _ = bm.acquire_cached_prefix(continued, max_blocks=2)
    assert hit == full
    # Another parent or other tokens find nothing.
    assert bm.take_tail(ROOT_HASH, continued, 4, 4) is None
    assert bm.take_tail(parent, [1, 2, 3, 4, 9, 9, 9], 4, 3) is None
    assert bm.take_tail(parent, continued, 4, 4) == (tail, 3)
    assert bm.ref_count(tail) == 1 and bm.num_cached_free_blocks == 0
    assert bm.take_tail(parent, continued, 4, 4) is None  # taken: it is written past its tokens now
    assert bm.stats.tail_hits == 1 and bm.stats.tail_tokens == 3


def test_a_tail_serves_its_leading_tokens_up_to_the_limit_and_the_longest_match_wins():
    bm = BlockManager(num_blocks=8, block_size=4)
    _, short, parent = _sequence_with_tail(bm, [1, 2, 3, 4, 5])
    _, longer, _ = _sequence_with_tail(bm, [1, 2, 3, 4, 5, 6, 7])
    assert bm.take_tail(parent, [1, 2, 3, 4, 5, 6, 7, 8], 4, 2) == (longer, 2)  # at most 2 tokens asked
    assert bm.take_tail(parent, [1, 2, 3, 4, 5, 0, 0], 4, 3) == (short, 1)


def test_tails_are_evicted_like_cached_blocks_and_kept_only_where_they_can_be_found():
    bm = BlockManager(num_blocks=3, block_size=4)
    _, tail, parent = _sequence_with_tail(bm, [1, 2, 3, 4, 5, 6])
    bm.allocate(1)  # the never-cached block
    bm.allocate(1)  # the least recently freed: the tail (freed first, as a sequence's end)
    assert bm.take_tail(parent, [1, 2, 3, 4, 5, 6, 7], 4, 3) is None
    # The full block stays cached; dropping the tail is no prefix eviction.
    assert bm.num_cached_free_blocks == 1 and bm.stats.evictions == 0
    # Not kept: a block that a second sequence references, no tokens, or the switch or prefix cache off.
    for manager, tokens, references in ((BlockManager(4, 4), (5,), 2), (BlockManager(4, 4), (), 1),
                                        (BlockManager(4, 4, reuse_partial_blocks=False), (5,), 1),
                                        (BlockManager(4, 4, enable_prefix_caching=False), (5,), 1)):
        block = manager.allocate(1)[0]
        manager.share([block] * (references - 1))
        manager.keep_tail(block, ROOT_HASH, tokens)
        manager.free([block] * references)
        assert manager.num_cached_free_blocks == 0 and manager.take_tail(ROOT_HASH, [5, 6], 0, 1) is None
