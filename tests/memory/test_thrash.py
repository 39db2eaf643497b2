"""The thrash tracker counts re-misses on evicted prefix blocks exactly, and nothing else."""

from __future__ import annotations

from tts_runtime import CacheConfig, Engine, EngineConfig, ScoreParams
from tts_runtime.engine.block_manager import ROOT_HASH, BlockManager
from memory.thrash import ThrashTracker


def _fill(bm: BlockManager, tokens: list[int]) -> list[int]:
    """Allocate and register blocks for `tokens` the way the engine does after a forward."""
    ids = bm.allocate(len(tokens) // bm.block_size)
    parent = ROOT_HASH
    for k, block_id in enumerate(ids):
        parent = bm.register_full_block(block_id, parent, tuple(tokens[k * 4:(k + 1) * 4]))
    return ids


def _lookup(bm: BlockManager, tokens: list[int]) -> list[int]:
    hit, _ = bm.acquire_cached_prefix(tokens + [0], max_blocks=len(tokens) // bm.block_size)
    bm.free(hit)
    return hit


def test_fill_evict_request_again_counts_each_evicted_block():
    tracker = ThrashTracker()
    bm = BlockManager(num_blocks=4, block_size=4, listeners=[tracker])
    a, b = list(range(8)), list(range(100, 116))
    bm.free(_fill(bm, a))  # allocations 1-2; both blocks cached
    assert len(_lookup(bm, a)) == 2 and tracker.thrash_events == 0
    bm.free(_fill(bm, b))  # allocations 3-6: two never-used blocks, then a's two are evicted
    assert tracker.evictions == 2
    assert _lookup(bm, a) == []
    assert tracker.thrash_events == 2 and tracker.reuse_distances == [4, 4]
    assert len(_lookup(bm, b)) == 4  # b is still cached: hits, no thrash
    assert _lookup(bm, list(range(50, 58))) == []  # never computed: a miss, not thrash
    assert (tracker.hits, tracker.misses, tracker.thrash_events) == (6, 4, 2)
    assert tracker.thrash_rate == 2 / 10
    summary = tracker.summary()
    assert summary["reuse_distance"] == {"count": 2, "mean": 4, "median": 4, "p90": 4, "max": 4}


def test_a_broken_chain_counts_only_the_evicted_block():
    tracker = ThrashTracker()
    bm = BlockManager(num_blocks=3, block_size=4, listeners=[tracker])
    a = list(range(8))
    head, tail = _fill(bm, a)
    bm.free([head])  # the head is least recently freed, so it is evicted first
    bm.free([tail])
    bm.allocate(2)  # one never-used block, then the head's
    assert _lookup(bm, a) == []
    # Both blocks miss (the chain breaks at the head), but only the head was lost.
    assert tracker.misses == 2 and tracker.thrash_events == 1


def test_recomputed_block_thrashes_again_from_its_new_computation():
    tracker = ThrashTracker()
    bm = BlockManager(num_blocks=1, block_size=4, listeners=[tracker])
    a, b = [1, 2, 3, 4], [5, 6, 7, 8]
    for _ in range(2):
        bm.free(_fill(bm, a))
        bm.free(_fill(bm, b))  # evicts a
        assert _lookup(bm, a) == []
    assert tracker.thrash_events == 2 and tracker.reuse_distances == [1, 1]


def test_nothing_evicted_means_no_thrash():
    tracker = ThrashTracker()
    bm = BlockManager(num_blocks=64, block_size=4, listeners=[tracker])
    prompts = [list(range(k, k + 16)) for k in range(0, 80, 20)]
    for tokens in prompts:
        bm.free(_fill(bm, tokens))
    for _ in range(3):
        for tokens in prompts:
            assert len(_lookup(bm, tokens)) == 4
    assert tracker.evictions == 0 and tracker.thrash_events == 0 and tracker.reuse_distances == []
    assert tracker.hit_rate == 1.0
    tracker.record_step(1, 0, 16, 48)
    assert tracker.timeline.to_dict() == {"steps": [1], "in_use": [0], "cached": [16], "free": [48], "stride": 1}


def _score_in_turn(engine: Engine, prompts: list[list[int]]) -> None:
    for prompt in prompts:
        engine.score([prompt], ScoreParams([len(prompt) - 1], [1, 2]))


def test_engine_prefix_cache_thrash_is_counted_exactly(generator_model):
    """Real engine, 4-block pool: prompt a (3 full blocks), then b and c push all of a out."""
    a, b, c = (list(range(start, start + 48)) for start in (100, 200, 300))
    tight = Engine(generator_model.name, EngineConfig(cache=CacheConfig(num_blocks=4, block_size=16)), loaded=generator_model)
    tracker = ThrashTracker()
    tight.add_block_listener(tracker)
    _score_in_turn(tight, [a, b, c, a])
    # The last token is always computed, so a's lookups cover its first 2 blocks: both were
    # computed (after allocation 3) and evicted; b and c allocated 6 blocks in between.
    assert tracker.thrash_events == 2 and tracker.reuse_distances == [6, 6]
    roomy = Engine(generator_model.name, EngineConfig(cache=CacheConfig(num_blocks=16, block_size=16)), loaded=generator_model)
    tracker = ThrashTracker()
    roomy.add_block_listener(tracker)
    _score_in_turn(roomy, [a, b, c, a])
    assert tracker.thrash_events == 0 and tracker.evictions == 0 and tracker.hits == 2


def test_lookup_retries_before_the_recompute_count_once():
    """A refused admission looks its prefix up again every step: one lost block, one event."""
    tracker = ThrashTracker()
    bm = BlockManager(num_blocks=1, block_size=4, listeners=[tracker])
    bm.free(_fill(bm, [1, 2, 3, 4]))
    bm.free(_fill(bm, [5, 6, 7, 8]))  # evicts the first block
    for _ in range(3):
        assert _lookup(bm, [1, 2, 3, 4]) == []
    assert tracker.misses == 3 and tracker.thrash_events == 1
