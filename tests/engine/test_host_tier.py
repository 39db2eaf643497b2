"""The host KV tier (Seesaw) and prefix-aware ordering (FastTTS), on the real generator,
its tokenizer and real MATH-500 questions; the tier's own LRU on a bare block manager."""

from __future__ import annotations

import pytest

from memory.thrash import ThrashTracker
from tts_runtime.config import CacheConfig, ConfigError, EngineConfig, ParallelConfig, SchedulerConfig
from tts_runtime.engine.block_manager import ROOT_HASH, BlockManager, chain_hash
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.host_tier import HostTier
from tts_runtime.engine.request import SamplingParams
from tts_runtime.executor.kv_cache import bytes_per_block
from tts_runtime.runs.datasets import DatasetConfig, load_problems

GREEDY = SamplingParams(temperature=0, max_tokens=8)
BLOCK = 16


@pytest.fixture(scope="module")
def questions(math500_path) -> list[str]:
    return [p.question for p in load_problems(DatasetConfig(dataset_path=str(math500_path), limit=4))]


def _engine(model, num_blocks: int, host_bytes: int = 0, **scheduler) -> tuple[Engine, ThrashTracker]:
    # Whole blocks only (the tier keeps no partial block), so that recomputes count in blocks.
    config = EngineConfig(cache=CacheConfig(num_blocks=num_blocks, block_size=16, host_kv_bytes=host_bytes,
                                            reuse_partial_blocks=False),
                          scheduler=SchedulerConfig(**scheduler))
    engine = Engine(model.name, config, loaded=model)
    tracker = ThrashTracker()
    engine.add_block_listener(tracker)
    return engine, tracker


def _prompts(engine: Engine, questions: list[str]) -> tuple[list[int], list[list[int]]]:
    """A question asked twice with different endings, and between them an unrelated
    110-token prompt that needs the whole 8-block pool (so the question's blocks leave it)."""
    question = engine.tokenize(questions[0])
    other = engine.tokenize(" ".join(questions[1:]))[:110]
    return question, [question + engine.tokenize(" Step 1:"), other, question + engine.tokenize(" Answer:")]


def _run_in_turn(engine: Engine, prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    tokens, computed = [], []
    for prompt in prompts:
        before = engine.stats.computed_tokens
        tokens.append(engine.generate([prompt], GREEDY)[0].completions[0].token_ids)
        computed.append(engine.stats.computed_tokens - before)
    return tokens, computed


def test_evicted_prefix_comes_back_from_the_host_tier(generator_model, questions):
    off, off_tracker = _engine(generator_model, 8)
    _, prompts = _prompts(off, questions)
    off_tokens, off_computed = _run_in_turn(off, prompts)
    evicted = off_tracker.thrash_events  # the question's blocks the other prompt pushed out
    assert evicted >= 2
    block_bytes = bytes_per_block(generator_model.arch, BLOCK, off.dtype)
    on, tracker = _engine(generator_model, 8, host_bytes=64 * block_bytes)
    on_tokens, on_computed = _run_in_turn(on, prompts)
    roomy, _ = _engine(generator_model, 200)
    roomy_tokens, roomy_computed = _run_in_turn(roomy, prompts)

    assert on_tokens == off_tokens == roomy_tokens
    # The second ask of the question recomputes its evicted blocks without the tier only.
    assert on_computed[:2] == off_computed[:2]
    assert on_computed[2] == off_computed[2] - evicted * BLOCK == roomy_computed[2]
    host = tracker.host
    assert host.hits == evicted and host.tokens_not_recomputed == evicted * BLOCK
    assert host.blocks_in == evicted and host.bytes_in == evicted * block_bytes
    assert host.blocks_out >= evicted and host.bytes_out == host.blocks_out * block_bytes
    assert host.swap_seconds > 0 and host.hidden_seconds == 0  # CPU: synchronous copies
    # Host hits are not recomputes: no thrash event is left with the tier.
    assert tracker.thrash_events == 0
    assert tracker.summary()["host_tier"]["hits"] == evicted
    assert on.snapshot()["host_hits"] == evicted
    # Counted as cached prompt tokens, exactly as device hits are.
    assert on.stats.cached_prompt_tokens == roomy.stats.cached_prompt_tokens


def test_a_tier_too_small_saves_part_and_the_rest_is_thrash(generator_model, questions):
    off, off_tracker = _engine(generator_model, 8)
    _, prompts = _prompts(off, questions)
    _run_in_turn(off, prompts)
    block_bytes = bytes_per_block(generator_model.arch, BLOCK, off.dtype)
    # One slot: the tier keeps only the block evicted last (the LRU list gives up a
    # sequence's tail first, so that is the question's earliest evicted-and-saved block);
    # the chain is served up to it and the blocks after it are recomputed.
    engine, tracker = _engine(generator_model, 8, host_bytes=block_bytes)
    _run_in_turn(engine, prompts)
    assert engine.host_kv.blocks.host_tier.num_slots == 1
    assert tracker.host.dropped > 0 and tracker.host.hits == 1
    assert tracker.thrash_events == off_tracker.thrash_events - 1 > 0


def _fill(bm: BlockManager, tokens: list[int]) -> list[int]:
    ids = bm.allocate(len(tokens) // bm.block_size)
    parent = 0
    for i, block_id in enumerate(ids):
        parent = bm.register_full_block(block_id, parent, tuple(tokens[i * bm.block_size:(i + 1) * bm.block_size]))
    return ids


def _lookup(bm: BlockManager, tokens: list[int]) -> list[int]:
    return bm.acquire_cached_prefix(tokens + [0], len(tokens) // bm.block_size)[0]


def test_tier_lru_keeps_the_most_recent_blocks_and_queues_one_batch():
    tier = HostTier(num_slots=2, block_bytes=100)
    tracker = ThrashTracker()
    bm = BlockManager(num_blocks=1, block_size=4, listeners=[tracker], host_tier=tier)
    a, b, c = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    for tokens in (a, b, c):  # each evicts the one before: a, then b go to the tier
        bm.free(_fill(bm, tokens))
    assert len(tier) == 2
    assert tier.take_plan().out_blocks == [0, 0]  # both saved from the one device block
    bm.free(_lookup(bm, a))  # a comes back (c is saved); a is now the tier's most recent
    plan = tier.take_plan()
    assert (plan.out_slots, plan.in_slots) == ([1], [0])  # c into b's slot (b was LRU), a read
    assert tracker.host.dropped == 1  # b
    assert _lookup(bm, b) == [] and tracker.thrash_events == 1
    assert tracker.host.hits == 1 and tracker.host.bytes_in == 100 and tracker.host.bytes_out == 300


def test_full_tier_never_reuses_a_slot_a_queued_load_reads():
    tier = HostTier(num_slots=1, block_bytes=100)
    bm = BlockManager(num_blocks=2, block_size=4, host_tier=tier)
    a, b, c = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    bm.free(_fill(bm, a))
    bm.free(_fill(bm, b))
    bm.free(_fill(bm, c + [13, 14, 15, 16]))  # evicts a (saved) then b (tier full: a dropped)
    tier.take_plan()
    assert chain_hash(ROOT_HASH, tuple(b)) in tier
    held = _lookup(bm, b)  # loads b; its slot is pinned until the copies run
    assert len(held) == 1
    assert tier.stats.rejected == 1  # making room for b evicted a block of c: the only slot is pinned
    bm.free(_fill(bm, [20, 21, 22, 23]))  # evicts c's other block: still pinned
    assert tier.stats.rejected == 2
    plan = tier.take_plan()
    assert plan.in_slots == [0] and plan.out_blocks == []


def test_prefetch_swaps_in_ahead_and_the_lookup_counts_a_host_hit():
    tier = HostTier(num_slots=4, block_bytes=100)
    tracker = ThrashTracker()
    bm = BlockManager(num_blocks=2, block_size=4, listeners=[tracker], host_tier=tier)
    a = [1, 2, 3, 4, 5, 6, 7, 8]
    bm.free(_fill(bm, a))
    bm.free(_fill(bm, [9] * 8))  # a's two blocks go to the tier
    hashes = bm.full_block_hashes(a, 2)
    assert bm.num_cached_prefix_blocks(hashes) == 2  # tier blocks count as cached
    assert bm.prefetch(a, hashes, reserve=0) == 2
    assert bm.num_cached_free_blocks == 2 and tracker.host.blocks_in == 2 and tracker.host.hits == 0
    assert len(_lookup(bm, a)) == 2
    assert tracker.host.hits == 2 and tracker.hits == 0


def test_prefetch_runs_in_a_real_engine_and_changes_no_token(generator_model, questions):
    """The question's second ask waits behind a short prompt (one sequence at a time): the
    prefetcher swaps its blocks in while the short prompt decodes, a step before admission."""
    probe, _ = _engine(generator_model, 8)
    _, prompts = _prompts(probe, questions)
    short = probe.tokenize(questions[3])[:10]
    block_bytes = bytes_per_block(generator_model.arch, BLOCK, probe.dtype)
    results = {}
    for host in (0, 64 * block_bytes):
        engine, tracker = _engine(generator_model, 8, host_bytes=host, max_num_seqs=1)
        events = []
        engine.add_block_listener(events.append)
        tokens, _ = _run_in_turn(engine, prompts[:2])
        tokens += [o.completions[0].token_ids for o in engine.generate([short, prompts[2]], GREEDY)]
        results[host] = (tokens, tracker, events)
    off_tokens, off_tracker, _ = results[0]
    tokens, tracker, events = results[64 * block_bytes]
    assert tokens == off_tokens
    evicted = off_tracker.thrash_events
    assert evicted >= 2 and tracker.host.hits == evicted and tracker.thrash_events == 0
    swap_in_steps = [e.step for e in events if e.kind == "swap_in"]
    hit_steps = [e.step for e in events if e.kind == "host_hit"]
    assert len(swap_in_steps) == evicted and max(swap_in_steps) < min(hit_steps)


def test_host_tier_with_pipeline_stages_is_one_line_error():
    with pytest.raises(ConfigError, match="--host-kv-memory needs --pp 1"):
        EngineConfig(cache=CacheConfig(host_kv_bytes=1 << 20), parallel=ParallelConfig(pp_size=2))
    with pytest.raises(ConfigError, match="must be >= 0"):
        CacheConfig(host_kv_bytes=-1)


def test_prefix_aware_order_admits_sharing_requests_together(generator_model, questions):
    engine, _ = _engine(generator_model, 200, prefix_aware_order=True)
    tok = engine.tokenize
    a, b = tok(questions[0]), tok(questions[1])
    prompts = [a + tok(" One."), b + tok(" One."), a + tok(" Two."), b + tok(" Two.")]
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, GREEDY)
    batch = engine.scheduler.schedule()
    assert [seq.group.request_id for seq, _ in batch.prefills] == ["r0", "r2", "r1", "r3"]


def test_prefix_aware_order_keeps_prefixes_hot_and_changes_no_token(generator_model, questions):
    """One sequence at a time through a pool that holds one question: in arrival order the
    other question evicts each prefix before its second ask; grouped, both asks hit."""
    outputs, hits = {}, {}
    for order in (False, True):
        engine, tracker = _engine(generator_model, 9, max_num_seqs=1, prefix_aware_order=order)
        tok = engine.tokenize
        a, b = tok(questions[0]), tok(" ".join(questions[1:]))[:100]
        prompts = [a + tok(" One."), b + tok(" One."), a + tok(" Two."), b + tok(" Two.")]
        outputs[order] = [o.completions[0].token_ids for o in engine.generate(prompts, GREEDY)]
        hits[order] = tracker.hits
    assert outputs[True] == outputs[False]
    assert hits[True] > hits[False]


@pytest.mark.parametrize("extra, fragment", [
    (["--pp", "2"], "--host-kv-memory needs --pp 1"),
    (["--overlap"], "--overlap moves each model's forward"),
])
def test_cli_refuses_the_tier_where_the_kv_is_not_in_this_process(math500_path, extra, fragment):
    from typer.testing import CliRunner

    from tts_runtime.cli import app

    result = CliRunner().invoke(app, ["beam", "--dataset-path", str(math500_path), "--limit", "1",
                                      "--host-kv-memory", "1MiB", *extra])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert fragment in lines[0]
