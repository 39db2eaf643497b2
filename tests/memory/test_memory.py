"""Memory profiles, split policies, the elastic KV pool and clear errors on bad input."""

from __future__ import annotations

import asyncio
import math
import os
import sys
from dataclasses import replace

import pytest
import torch

from evals.memory_sweep import parse_splits, settings_for
from memory.elastic import ElasticPolicy, Pressure
from memory.pool import ChunkLayout, ElasticKVPool, MemberLayout
from memory.profile import MemoryProfile, weight_bytes
from memory.split import MemoryConfig, Workload, plan_memory
from tts_runtime.options import parse_size
from tts_runtime import ConfigError, EngineConfig, SamplingParams, SchedulerConfig, ScoreParams
from tts_runtime.cohost.runtime import Runtime, profile_models, profile_one
from tts_runtime.engine.block_manager import ROOT_HASH, BlockManager
from tts_runtime.engine.scheduler import Scheduler
from tts_runtime.engine.sequence import RequestGroup, Sequence
from tts_runtime.executor.device_memory import return_freed_host_memory

# oneDNN on the plain weights on any CPU: the budgets below are sized for weights without a
# packed copy (`auto` keeps a stream of fp32 weights beside them on AVX2-only CPUs).
CONFIG = EngineConfig(scheduler=SchedulerConfig(max_num_batched_tokens=128), linear_backend="onednn")
GiB = 1 << 30


@pytest.fixture(scope="module")
def profiles(generator_model, prm_model):
    return profile_models(generator_model, prm_model, CONFIG)


def _fake_profile(name: str, kv_per_token: int, weights: int = 100 << 20, activations: int = 10 << 20) -> MemoryProfile:
    return MemoryProfile(name, weights, activations, 0, kv_per_token, 8, 16, 128, "test", 10 ** 8)


# -- profiles and static splits ------------------------------------------------------
def test_profile_measures_a_real_forward_and_adds_up(generator_model, prm_model, profiles):
    measured = profile_one(generator_model, "generate", CONFIG, cache=None)
    assert measured.weights_bytes == weight_bytes(generator_model.model) > 100 << 20
    # At least the full-vocabulary logits of the sampled rows (128 rows x 49152 x fp32).
    assert measured.activation_bytes >= 128 * generator_model.arch.vocab_size * 4
    assert measured.profiled_tokens == 128 and measured.non_torch_bytes == 0
    arch = generator_model.arch
    assert measured.kv_bytes_per_token_per_layer == 2 * arch.num_kv_heads * arch.head_dim * 4
    assert measured.block_bytes == CONFIG.cache.block_size * measured.kv_bytes_per_token_per_layer * arch.num_layers
    gen, prm = profiles
    budget = 3 * GiB
    for fraction in (0.1, 0.3, 0.55, 0.9):
        plan = plan_memory(MemoryConfig(device_memory=budget, prm_fraction=fraction), gen, prm)
        fixed = gen.weights_bytes + prm.weights_bytes + gen.activation_bytes + prm.activation_bytes
        assert plan.kv_bytes == int(budget * 0.9) - fixed - plan.non_torch_bytes
        prm_kv = math.floor(plan.kv_bytes * fraction)
        assert plan.prm_blocks == prm_kv // prm.block_bytes
        assert plan.generator_blocks == (plan.kv_bytes - prm_kv) // gen.block_bytes


def test_static_runtime_gets_exactly_the_planned_blocks(generator_model, prm_model, profiles):
    runtime = Runtime(generator_model, prm_model, MemoryConfig(device_memory=2 * GiB, prm_fraction=0.4),
                      CONFIG, profiles=profiles)
    assert runtime.generator.blocks.num_usable_blocks == runtime.plan.generator_blocks
    assert runtime.prm.blocks.num_usable_blocks == runtime.plan.prm_blocks
    assert runtime.generator.executor.kv_caches[0][0].shape[0] == runtime.plan.generator_blocks
    metrics = runtime.memory_metrics()
    assert metrics["plan"]["prm_fraction"] == 0.4 and metrics["elastic"] is None


def test_auto_split_follows_the_workload_and_says_why():
    gen, prm = _fake_profile("g", 32 << 10), _fake_profile("p", 128 << 10)
    even = Workload(8, 500, 8, 500)
    plan = plan_memory(MemoryConfig(device_memory=2 * GiB, policy="auto"), gen, prm, workload=even)
    assert plan.prm_fraction == pytest.approx(0.8)  # same tokens, 4x the bytes per token
    assert "PRM 8 sequences x 500 tokens x 128 KiB" in plan.reason and "0.80" in plan.reason
    light = Workload(8, 500, 2, 125)  # the PRM holds few, short sequences
    plan = plan_memory(MemoryConfig(device_memory=2 * GiB, policy="auto"), gen, prm, workload=light)
    assert plan.prm_fraction == pytest.approx(0.2)
    beam = Workload.beam_search(beams=4, problems_in_flight=2, generator_prompt_tokens=100,
                                prm_prompt_tokens=200, steps=5, step_tokens=40)
    assert (beam.generator_sequences, beam.generator_tokens, beam.prm_tokens) == (8, 225, 250)


def test_bad_memory_input_is_a_clear_error(profiles):
    for split in (0.0, 1.0, 1.5, -0.2):
        with pytest.raises(ConfigError, match=r"memory split must be in \(0, 1\)"):
            MemoryConfig(prm_fraction=split)
    with pytest.raises(ConfigError, match=r"memory split must be in \(0, 1\)"):
        parse_splits("0.5:1.2:0.2")
    with pytest.raises(ConfigError, match="name no split: start:stop:step needs start <= stop"):
        parse_splits("0.5:0.1:0.1")
    assert parse_splits("0.1:0.5:0.2") == [0.1, 0.3, 0.5]
    with pytest.raises(ConfigError, match="unknown memory policy 'greedy'; choose one of static, auto, elastic"):
        MemoryConfig(policy="greedy")
    with pytest.raises(ConfigError, match="unknown memory policy 'greedy'"):
        settings_for([0.3], ["static", "greedy"])
    with pytest.raises(ConfigError, match="cannot read memory size"):
        parse_size("6 parsecs")
    assert parse_size("6GiB") == 6 * GiB and parse_size("512MiB") == 512 << 20
    gen, prm = profiles
    with pytest.raises(ConfigError, match="the minimum is") as error:
        plan_memory(MemoryConfig(device_memory=1 * GiB), gen, prm)
    minimum = int(str(error.value).split("(")[-1].split(" bytes")[0])
    fixed = gen.weights_bytes + prm.weights_bytes + gen.activation_bytes + prm.activation_bytes
    assert minimum == math.ceil((fixed + gen.block_bytes + prm.block_bytes) / 0.9)
    plan_memory(MemoryConfig(device_memory=minimum, policy="auto"), gen, prm)  # the minimum is enough
    with pytest.raises(ConfigError, match="the minimum is"):
        plan_memory(MemoryConfig(device_memory=minimum - 2), gen, prm)
    with pytest.raises(ConfigError, match="device memory budget 1.0 KiB is below"):
        plan_memory(MemoryConfig(device_memory=parse_size("1KiB")), gen, prm)
    with pytest.raises(ConfigError, match="device memory budget 100 bytes is below"):
        plan_memory(MemoryConfig(device_memory=100), gen, prm)



def test_a_cpu_budget_beyond_free_memory_is_an_error_and_the_default_shrinks_to_fit(generator_model, prm_model,
                                                                                     profiles):
    """On CPU the KV caches are this machine's memory: more than is free would end in the
    kernel's out-of-memory killer minutes later (a bench at the 8GiB default did)."""
    gen, prm = profiles
    fixed = gen.weights_bytes + prm.weights_bytes + gen.activation_bytes + prm.activation_bytes
    free = 1 * GiB
    with pytest.raises(ConfigError, match="has 1.00 GiB of memory free; pass --device-memory") as error:
        plan_memory(MemoryConfig(device_memory=8 * GiB), gen, prm, host_available=free)
    suggested = parse_size(str(error.value).split("--device-memory ")[-1].split()[0])
    assert plan_memory(MemoryConfig(device_memory=suggested), gen, prm, host_available=free).kv_bytes <= free
    default = plan_memory(MemoryConfig(), gen, prm, host_available=free)
    assert default.budget_bytes < 8 * GiB and default.kv_bytes <= free * 3 // 4
    assert plan_memory(MemoryConfig(), gen, prm, host_available=64 * GiB).budget_bytes == 8 * GiB
    assert plan_memory(MemoryConfig(device_memory=2 * GiB), gen, prm, host_available=free).kv_bytes \
        == int(2 * GiB * 0.9) - fixed  # a budget that fits is kept as given
    # A budget beyond all of a device's memory (a GPU's total once the runtime holds it).
    with pytest.raises(ConfigError, match="--device-memory 100.00 GiB is more than the device has in all"):
        plan_memory(MemoryConfig(device_memory=100 * GiB), gen, prm, device_total=80 * GiB)
    assert plan_memory(MemoryConfig(device_memory=80 * GiB), gen, prm, device_total=80 * GiB).budget_bytes == 80 * GiB
    # The runtime reads what this machine has free.
    with pytest.raises(ConfigError, match="of memory free; pass --device-memory"):
        Runtime(generator_model, prm_model, MemoryConfig(device_memory=1 << 50), CONFIG, profiles=profiles)

# -- the elastic pool ------------------------------------------------------------------
def _pool() -> tuple[ElasticKVPool, BlockManager, BlockManager]:
    """Four chunks of 96 bytes: 2 blocks of model a or 3 of model b each; b owns the top two."""
    layout = ChunkLayout(96, 4, {"a": MemberLayout(48, 48, 2), "b": MemberLayout(32, 32, 3)})
    pool = ElasticKVPool.split(layout, "a", "b", 2, torch.device("cpu"))
    managers = {}
    for name in ("a", "b"):
        managers[name] = BlockManager(layout.num_blocks(name), 4, usable_blocks=pool.usable_blocks(name))
        pool.attach(name, managers[name])
    return pool, managers["a"], managers["b"]


def test_pool_moves_free_chunks_uncached_first_and_never_a_block_in_use():
    pool, a, b = _pool()
    assert pool.chunks_of("a") == [0, 1] and pool.chunks_of("b") == [2, 3]
    assert a.num_usable_blocks == 4 and b.num_usable_blocks == 6
    held = b.allocate(1)  # lowest free id first: block 6, in chunk 2
    assert held == [6]
    cached = b.allocate(1)  # block 7, chunk 2; registered then freed: cached but free
    b.register_full_block(cached[0], ROOT_HASH, (1, 2, 3, 4))
    b.free(cached)
    assert pool.movable_chunks("b") == [3]  # chunk 2 holds a block in use
    pool.buffer.fill_(7)
    move = pool.move("b", "a", 2, step=5, reason="test")
    assert move.chunks == (3,) and move.evicted_blocks == 0
    assert pool.owners == ["a", "a", "b", "a"] and a.num_usable_blocks == 6 and b.num_usable_blocks == 3
    assert (pool.num_blocks_of("a"), pool.num_blocks_of("b")) == (6, 3)  # the policy's count follows the move
    assert torch.all(pool.buffer[3 * 96:] == 0) and torch.all(pool.buffer[2 * 96:3 * 96] == 7)
    with pytest.raises(ValueError, match="in use"):
        b.remove_free_blocks(held)
    assert b.is_usable(held[0]) and b.ref_count(held[0]) == 1
    b.free(held)
    events = []
    b.listeners.append(events.append)
    move = pool.move("b", "a", 1, step=6, reason="test")  # chunk 2 is free now; its cached block is evicted
    assert move.chunks == (2,) and move.evicted_blocks == 1
    assert [e.kind for e in events] == ["evict"] and b.num_usable_blocks == 0 == pool.num_blocks_of("b")
    assert pool.move("b", "a", 1, step=7, reason="test") is None  # nothing left to give
    assert a.allocate(8) == [0, 1, 2, 3, 4, 5, 6, 7]  # a got the ids of both chunks in its view


@pytest.mark.parametrize("cache_in, free_order, expected", [
    ((6, 9), (6, 9), [2, 3]),  # both chunks cached: the one freed longest ago goes first
    ((6, 9), (9, 6), [3, 2]),
    ((6,), (6,), [3, 2]),  # a chunk holding no cached block goes before any cached one
])
def test_pool_gives_uncached_then_least_recently_used_chunks(cache_in, free_order, expected):
    pool, _, b = _pool()
    assert b.allocate(6) == [6, 7, 8, 9, 10, 11]
    for k, block in enumerate(cache_in):
        b.register_full_block(block, ROOT_HASH, (k, k, k, k))
    b.free([x for x in range(6, 12) if x not in free_order])
    for block in free_order:
        b.free([block])
    assert pool.movable_chunks("b") == expected


# -- elastic at run time ---------------------------------------------------------------
QUESTIONS = ["What is 7 times 8?", "Solve for x: 3x - 7 = 11.", "What is the area of a circle of radius 3?",
             "Name a prime number larger than 100.", "What is the square root of 144?",
             "How many sides does a hexagon have?"]


def _scripted(runtime: Runtime, gen_prompts, prm_prompts) -> tuple[list, list]:
    """A generator-only phase, then a PRM-only phase."""
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)

    async def phase(submit):
        futures = submit()
        everything = asyncio.gather(*futures)
        await runtime.drive(everything)
        return await everything

    async def script():
        first = await phase(lambda: [runtime.submit_generate(p, greedy) for p in gen_prompts])
        scores = await phase(lambda: [runtime.submit_score(p, ScoreParams([len(p) - 1], [1, 2])) for p in prm_prompts])
        return [o.completions[0].token_ids for o in first], [o.scores[0] for o in scores]

    return asyncio.run(script())


def test_elastic_moves_chunks_to_the_starved_model_and_matches_static(generator_model, prm_model, profiles):
    gen, prm = profiles
    tok = generator_model.tokenizer
    gen_prompts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=True,
                                           add_generation_prompt=True, return_dict=False) for q in QUESTIONS[:4]]
    # Long score prompts: two in flight hold more blocks than the PRM's initial share.
    prm_prompts = [prm_model.tokenizer(" ".join(4 * (QUESTIONS[i:] + QUESTIONS[:i])))["input_ids"] for i in range(2)]
    # A KV budget of 8 chunks: each phase alone needs more than its model's initial share.
    fixed = gen.weights_bytes + prm.weights_bytes + gen.activation_bytes + prm.activation_bytes
    chunk = math.lcm(gen.block_bytes, prm.block_bytes)
    budget = math.ceil((fixed + 8 * chunk) / 0.9)
    elastic = Runtime(generator_model, prm_model, MemoryConfig(device_memory=budget, policy="elastic"),
                      CONFIG, profiles=profiles)
    assert elastic.plan.chunks.num_chunks == 8
    got = _scripted(elastic, gen_prompts, prm_prompts)
    moves = elastic.pool.moves
    assert moves, "a starved model must receive chunks"
    to_gen = [m for m in moves if m.receiver == "generator"]
    to_prm = [m for m in moves if m.receiver == "prm"]
    assert to_gen and to_prm and to_gen[0].step < to_prm[0].step
    assert all(m.reason for m in moves)
    # Ownership and the block managers agree: every chunk has one owner, every id one pool.
    for name, engine in elastic.engines.items():
        assert sorted(b for b in range(engine.blocks.num_blocks) if engine.blocks.is_usable(b)) == \
            elastic.pool.usable_blocks(name)
    metrics = elastic.memory_metrics()
    assert metrics["elastic"]["chunks_moved"] == sum(len(m.chunks) for m in moves)
    assert metrics["generator"]["blocks"]["max"] > metrics["generator"]["blocks"]["start"]
    # Moving only free blocks never corrupts a computation: same outputs as a roomy static split.
    static = Runtime(generator_model, prm_model, MemoryConfig(device_memory=3 * GiB, prm_fraction=0.5),
                     CONFIG, profiles=profiles)
    expected = _scripted(static, gen_prompts, prm_prompts)
    assert static.memory_metrics()["generator"]["preemptions"] == 0
    assert got[0] == expected[0]
    for scores, reference in zip(got[1], expected[1]):
        assert scores == pytest.approx(reference, abs=1e-5)


def test_waiting_blocks_count_a_shared_prefix_block_once():
    """What an elastic donor keeps for its queue: four beams of one problem wait, sharing 3
    full blocks of which a running beam holds the first 2."""
    blocks = BlockManager(40, 4)
    scheduler = Scheduler(SchedulerConfig(), blocks)
    shared = list(range(100, 112))
    parent = ROOT_HASH
    for k, block_id in enumerate(blocks.allocate(2)):  # held: the running beam's references stay
        parent = blocks.register_full_block(block_id, parent, tuple(shared[4 * k:4 * k + 4]))
    for beam in range(4):
        tokens = shared + [200 + 10 * beam + i for i in range(6)]  # 18 tokens: 5 blocks each
        group = RequestGroup(f"beam{beam}", tokens, SamplingParams(temperature=0, max_tokens=8))
        group.sequences.append(Sequence(beam, group, list(tokens)))
        scheduler.add(group.sequences[0])
    # Each beam's own blocks: a full one (tokens 12-15) and a partial one (16-17), 4 x 2;
    # the third shared block once; the two held blocks not at all. Per beam it would be 5 x 4.
    assert scheduler.num_waiting_blocks() == 4 * 2 + 1
    # Without prefix caching nothing is shared.
    plain = Scheduler(SchedulerConfig(), BlockManager(40, 4, enable_prefix_caching=False))
    for seq in list(scheduler.waiting):
        plain.add(seq)
    assert plain.num_waiting_blocks() == 4 * 5


# -- the elastic policy on scripted pressure -------------------------------------------
def _pressure(owned: int, *, work: bool = True, free: int = 0, waiting: int = 0, progress: int = 1,
              preemptions: int = 0, stalls: int = 0, thrash: int = 0) -> Pressure:
    return Pressure(has_work=work, owned_blocks=owned, free_blocks=free, blocks_to_progress=progress,
                    preemptions=preemptions, admission_stalls=stalls, count_waiting_blocks=lambda: waiting,
                    thrash_events=thrash)


def _policy() -> tuple[ElasticPolicy, ElasticKVPool, BlockManager, BlockManager]:
    pool, a, b = _pool()  # a owns chunks 0-1 (4 blocks), b owns 2-3 (6 blocks), all free
    return ElasticPolicy(pool, {"a": 1.0, "b": 1.0}), pool, a, b


def _no_yield():
    raise AssertionError("no model should have to yield")


def test_policy_gives_a_starved_model_the_donors_unused_chunks_only():
    policy, pool, a, b = _policy()
    calm = {"a": _pressure(4, free=4), "b": _pressure(6, free=6)}
    assert policy.rebalance(calm, 0, {}) == {"a", "b"} and pool.moves == []
    # a preempted and 5 blocks wait with 1 free: it wants 4 blocks = 2 chunks; b, idle,
    # could give both, but one holds a cached prefix: a starvation move leaves that one.
    b.register_full_block(b.allocate(1)[0], ROOT_HASH, (1, 2, 3, 4))
    b.free([6])
    starved = {"a": _pressure(4, free=1, waiting=5, preemptions=1), "b": _pressure(6, free=6, work=False)}
    policy.rebalance(starved, 1, {})
    assert [(m.donor, m.receiver, m.chunks, m.evicted_blocks) for m in pool.moves] == [("b", "a", (3,), 0)]
    assert "starved: a" in pool.moves[0].reason and pool.num_blocks_of("a") == 6
    # A busy donor keeps what its running and waiting sequences hold.
    policy, pool, _, _ = _policy()
    policy.rebalance(calm, 0, {})
    busy = {"a": _pressure(4, free=1, waiting=5, stalls=1), "b": _pressure(6, free=2, waiting=1)}
    policy.rebalance(busy, 1, {})
    assert pool.moves == []  # b holds 4 and waits for 1: it needs both of its chunks
    # Once a's recent recomputes clearly outweigh b's, starvation takes cached chunks too.
    policy, pool, a, b = _policy()
    b.register_full_block(b.allocate(1)[0], ROOT_HASH, (1, 2, 3, 4))
    b.free([6])
    policy.rebalance(calm, 0, {})
    policy.rebalance({"a": _pressure(4, free=4, thrash=2), "b": _pressure(6, free=6, work=False)}, 1, {})
    assert [(m.receiver, m.chunks) for m in pool.moves] == [("a", (3,))]  # thrash: the uncached chunk
    policy.rebalance({"a": _pressure(6, free=1, waiting=5, preemptions=1, thrash=2),
                      "b": _pressure(3, free=3, work=False)}, 2, {})
    assert [(m.receiver, m.chunks, m.evicted_blocks) for m in pool.moves[1:]] == [("a", (2,), 1)]
    assert "cached ones included" in pool.moves[1].reason


def test_policy_counts_waiting_blocks_only_when_it_would_move_memory():
    """The count walks every waiting sequence's blocks: a step that moves nothing skips it."""
    def uncounted() -> int:
        raise AssertionError("waiting blocks counted on a step that moves nothing")

    policy, pool, _, _ = _policy()
    calm = {name: replace(_pressure(owned, free=owned), count_waiting_blocks=uncounted)
            for name, owned in (("a", 4), ("b", 6))}
    for step in range(3):
        assert policy.rebalance(calm, step, {}) == {"a", "b"}
    counted = []
    starved = {"a": replace(_pressure(4, free=1, preemptions=1), count_waiting_blocks=lambda: counted.append(1) or 5),
               "b": _pressure(6, free=6, work=False)}
    policy.rebalance(starved, 3, {})
    assert len(counted) == 1 and pool.num_blocks_of("a") == 8  # read twice (deficit, reason), counted once


def test_policy_moves_on_thrash_only_while_the_receiver_loses_clearly_more():
    policy, pool, _, _ = _policy()
    policy.rebalance({"a": _pressure(4, free=4), "b": _pressure(6, free=6, work=False)}, 0, {})
    policy.rebalance({"a": _pressure(4, free=4, thrash=3), "b": _pressure(6, free=6, work=False)}, 1, {})
    assert [(m.receiver, len(m.chunks)) for m in pool.moves] == [("a", 2)]  # 3 blocks -> 2 chunks of 2
    assert pool.moves[0].reason.startswith("thrash: a recomputed 3")
    # b loses 4 blocks, not 1.5x a's recent 3: nothing moves back (no sloshing).
    policy.rebalance({"a": _pressure(8, free=8, thrash=3), "b": _pressure(0, work=False, thrash=4)}, 2, {})
    assert len(pool.moves) == 1
    # b loses 3 more: now clearly the worse off, it gets one chunk (3 of its blocks) back.
    policy.rebalance({"a": _pressure(8, free=8, thrash=3), "b": _pressure(0, work=False, thrash=7)}, 3, {})
    assert [(m.receiver, len(m.chunks)) for m in pool.moves] == [("a", 2), ("b", 1)]


def test_policy_guarantees_progress_and_breaks_a_deadlock_by_preemption():
    policy, pool, _, _ = _policy()
    # b's largest sequence needs 8 blocks and b owns 6: it takes a's free chunk(s).
    runnable = policy.rebalance({"a": _pressure(4, free=4, work=False, progress=0),
                                 "b": _pressure(6, free=6, progress=8)}, 0, {"a": _no_yield, "b": _no_yield})
    assert runnable == {"b"} and pool.num_blocks_of("b") >= 8
    assert pool.moves[0].reason.startswith("progress: b needs 8 blocks")
    policy, pool, a, b = _policy()
    held_a, held_b = a.allocate(4), b.allocate(6)  # everything in use: nothing can move
    yielded = []

    def yield_a() -> Pressure:
        a.free(held_a)
        yielded.append("a")
        return _pressure(4, free=4, progress=3)

    runnable = policy.rebalance({"a": _pressure(4, progress=5), "b": _pressure(6, progress=7)}, 0,
                                {"a": yield_a, "b": _no_yield})
    assert yielded == ["a"] and runnable == {"b"} and pool.num_blocks_of("b") == 9
    assert "neither model could step; a preempted" in pool.moves[-1].reason
    b.free(held_b)


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm and glibc's malloc_trim")
def test_freed_tensor_memory_goes_back_to_the_os():
    """The heap a sweep's earlier runtimes freed stays resident until trimmed: freeing a
    mapped 24 MiB block raises glibc's mmap threshold, the next 8 MiB buffers come from the
    heap, and with the last one kept at its top nothing shrinks it on free."""
    mapped = torch.ones(24 << 20, dtype=torch.uint8)
    del mapped
    buffers = [torch.ones(8 << 20, dtype=torch.uint8) for _ in range(48)]
    top = buffers.pop()
    del buffers
    before = _resident_bytes()
    return_freed_host_memory()
    assert before - _resident_bytes() > 256 << 20
    del top
