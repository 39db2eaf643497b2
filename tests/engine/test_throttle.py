"""gLLM token throttling and pipeline-aware scheduling on hand-built scheduler states.

Every expected number is worked out by hand in the comments next to it, from
#P = min(max(#WP / #T, #MinP), #MaxP * max((KVfree - θ) / (1 - θ), 0)), #P = 0 below θ.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tts_runtime import ConfigError, Engine, EngineConfig, SamplingParams, SchedulerConfig
from tts_runtime.cli import app
from tts_runtime.config import ThrottleConfig
from tts_runtime.engine.block_manager import ROOT_HASH, BlockManager
from tts_runtime.engine.scheduler import Scheduler
from tts_runtime.engine.sequence import RequestGroup, Sequence, SequenceStatus
from tts_runtime.engine.throttle import prefill_token_budget

BLOCK = 4
# Small parameters so the hand arithmetic stays readable: #T=4, #MaxP=256, #MinP=16, θ=0.1.
SMALL = ThrottleConfig(iterations=4, max_prefill=256, min_prefill=16, kv_threshold=0.1)


def make_scheduler(num_blocks: int = 40, pp_size: int = 1, policy: str = "throttle") -> Scheduler:
    config = SchedulerConfig(policy=policy, throttle=SMALL)
    return Scheduler(config, BlockManager(num_blocks, BLOCK), pp_size=pp_size)


def request(seq_id: int, tokens: list[int]) -> Sequence:
    group = RequestGroup(f"r{seq_id}", list(tokens), SamplingParams(temperature=0, max_tokens=64))
    seq = Sequence(seq_id, group, list(tokens))
    group.sequences.append(seq)
    return seq


def prompt(seq_id: int, length: int) -> list[int]:
    """Token ids no other sequence shares (no accidental prefix hit)."""
    return [1000 * (seq_id + 1) + i for i in range(length)]


def running_decode(scheduler: Scheduler, seq_id: int, prompt_len: int = 6) -> Sequence:
    """A sequence whose prompt is computed and whose first sampled token awaits its decode."""
    seq = request(seq_id, prompt(seq_id, prompt_len))
    seq.token_ids.append(7)
    seq.num_computed_tokens = prompt_len
    seq.block_table = scheduler.blocks.allocate(-(-prompt_len // BLOCK))
    seq.status = SequenceStatus.RUNNING
    scheduler.running.append(seq)
    return seq


def cache_prefix(blocks: BlockManager, tokens: list[int]) -> None:
    """Compute-and-free: the full blocks of `tokens` end up cached and free, as after a
    finished request."""
    ids = blocks.allocate(len(tokens) // BLOCK)
    parent = ROOT_HASH
    for k, block_id in enumerate(ids):
        parent = blocks.register_full_block(block_id, parent, tuple(tokens[k * BLOCK:(k + 1) * BLOCK]))
    blocks.free(ids)


# -- the formula ------------------------------------------------------------------------
@pytest.mark.parametrize("waiting, kv_free, expected", [
    # paper defaults (#T=8, #MaxP=2048, #MinP=32, θ=0.05)
    (4000, 1.0, 500),    # max(4000//8=500, 32)=500; KV term 2048*(0.95/0.95)=2048 -> 500
    (100, 1.0, 32),      # 100//8=12 is floored to #MinP=32; KV term 2048 -> 32
    (40000, 0.5, 970),   # waiting term 5000; KV term 2048*(0.45/0.95)=970.1 -> 970
    (100, 0.06, 21),     # waiting term 32; KV term 2048*(0.01/0.95)=21.6 -> 21: #MinP does not floor it
    (4000, 0.05, 0),     # KV term 2048*0 = 0
    (4000, 0.04, 0),     # below θ: no prefill
    (0, 1.0, 32),        # nothing waiting: #MinP (the scheduler has nothing to spend it on)
])
def test_prefill_budget_follows_the_reference_formula(waiting, kv_free, expected):
    assert prefill_token_budget(waiting, kv_free, ThrottleConfig()) == expected


def test_throttle_config_rejects_bad_values():
    for bad in ({"iterations": 0}, {"max_prefill": 0}, {"min_prefill": 3000}, {"kv_threshold": 1.0},
                {"kv_threshold": -0.1}):
        with pytest.raises(ConfigError, match="invalid throttle setting"):
            ThrottleConfig(**bad)
    with pytest.raises(ConfigError, match="unknown scheduler policy 'fifo'"):
        Scheduler(SchedulerConfig(policy="fifo"), BlockManager(8, BLOCK))


@pytest.mark.parametrize("args, fragment", [
    (["--scheduler-policy", "fifo"], "unknown scheduler policy 'fifo'"),
    (["--scheduler-policy", "throttle", "--throttle-kv-threshold", "1.5"], "kv threshold must be in [0, 1)"),
])
def test_cli_rejects_bad_scheduler_options_in_one_line(args, fragment):
    result = CliRunner().invoke(app, ["beam", *args])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert lines[0].startswith("error: ") and fragment in lines[0]


# -- #P on scheduler states -------------------------------------------------------------
def test_waiting_tokens_spread_over_t_microbatches():
    scheduler = make_scheduler()
    first, second = request(0, prompt(0, 40)), request(1, prompt(1, 40))
    scheduler.add(first)
    scheduler.add(second)
    assert scheduler.num_uncached_prefill_tokens() == 80
    # #WP=80 -> 80//4=20 (above #MinP=16); KVfree 40/40=1.0 -> 256*(0.9/0.9)=256; #P=20.
    batch = scheduler.schedule()
    assert batch.prefills == [(first, 20)] and not batch.decodes
    # The step computed (engine side): #WP=80-20=60 -> 15, floored to #MinP=16.
    # 5 of 40 blocks are held: KVfree=35/40=0.875 -> 256*(0.775/0.9)=220.4 -> 220; #P=16.
    first.num_computed_tokens += 20
    assert scheduler.kv_free_fraction() == 35 / 40
    assert scheduler.schedule().prefills == [(first, 16)]


@pytest.mark.parametrize("held, expected", [
    (30, 20),  # KVfree 10/40=0.25 -> 256*(0.15/0.9)=42.7 -> 42; waiting term 20 -> 20
    (34, 14),  # KVfree 6/40=0.15 -> 256*(0.05/0.9)=14.2 -> 14 < #MinP=16: the KV term wins
    (37, 0),   # KVfree 3/40=0.075 < θ=0.1: no prefill at all
])
def test_free_kv_throttles_prefill(held, expected):
    scheduler = make_scheduler()
    # A decode holding `held` blocks; its next token still fits in its last block.
    others = running_decode(scheduler, 9, prompt_len=held * BLOCK - 1)
    scheduler.add(request(0, prompt(0, 40)))
    scheduler.add(request(1, prompt(1, 40)))
    # #WP = 80 waiting (the decode adds none) -> waiting term 80//4 = 20.
    assert scheduler.num_uncached_prefill_tokens() == 80
    batch = scheduler.schedule()
    assert batch.decodes == [others]
    assert sum(n for _, n in batch.prefills) == expected


def test_prefill_goes_on_below_the_threshold_when_nothing_else_can_free_blocks():
    """One long prompt fills the pool: no decode will ever free a block, so instead of
    stalling for good the scheduler lets #MinP tokens through."""
    scheduler = make_scheduler(num_blocks=50)
    seq = request(0, prompt(0, 190))
    seq.num_computed_tokens, seq.block_table = 184, scheduler.blocks.allocate(46)
    seq.status = SequenceStatus.RUNNING
    scheduler.running.append(seq)
    # KVfree = 4/50 = 0.08 < θ=0.1: the formula gives #P=0; the fallback #MinP=16 covers
    # the 6 tokens left (190 tokens in 48 blocks: 2 more of the 4 free).
    assert prefill_token_budget(scheduler.num_uncached_prefill_tokens(), scheduler.kv_free_fraction(), SMALL) == 0
    assert scheduler.schedule().prefills == [(seq, 6)]


def test_prefix_cached_tokens_do_not_count_as_waiting():
    scheduler = make_scheduler()
    shared = prompt(0, 40)
    cache_prefix(scheduler.blocks, shared)  # 10 full blocks cached and free
    stats = (scheduler.blocks.stats.prefix_queries, scheduler.blocks.stats.prefix_hits)
    extended = request(1, shared + prompt(1, 8))   # 48 tokens: 10 blocks cached, 8 tokens new
    same = request(2, shared)                      # 40 tokens: the last token is always computed,
    scheduler.add(extended)                        # so 9 blocks (36 tokens) hit and 4 are new
    scheduler.add(same)
    assert scheduler.num_uncached_prefill_tokens() == 8 + 4
    # The lookup was read-only: no reference taken, no stats counted, nothing left the free list.
    assert (scheduler.blocks.stats.prefix_queries, scheduler.blocks.stats.prefix_hits) == stats
    assert scheduler.blocks.num_cached_free_blocks == 10
    # #WP=12 -> 12//4=3, floored to #MinP=16; KVfree=1.0: #P=16 covers both new parts.
    batch = scheduler.schedule()
    assert batch.prefills == [(extended, 8), (same, 4)]


def test_waiting_count_follows_the_prefix_cache_between_calls():
    """The count is kept per waiting sequence between calls; it must still change the
    moment the cache gains or loses one of the sequence's blocks."""
    scheduler = make_scheduler(num_blocks=20)
    shared = prompt(0, 16)
    scheduler.add(request(1, shared + prompt(1, 8)))
    assert scheduler.num_uncached_prefill_tokens() == 24
    cache_prefix(scheduler.blocks, shared)  # 4 blocks cached: 16 tokens served
    assert scheduler.num_uncached_prefill_tokens() == 8
    # Taking every block evicts the cached ones (LRU): the tokens are uncached again.
    taken = scheduler.blocks.allocate(20)
    assert scheduler.num_uncached_prefill_tokens() == 24
    scheduler.blocks.free(taken)
    cache_prefix(scheduler.blocks, shared[:8])  # only the first two blocks come back
    assert scheduler.num_uncached_prefill_tokens() == 16



def test_admission_reuses_the_waiting_count_hashes_and_an_abort_drops_them():
    """Admission looks the prompt up with the hashes the waiting count made (and is served
    the cached blocks); a sequence finished while waiting leaves no memo behind."""
    scheduler = make_scheduler(num_blocks=20)
    shared = prompt(0, 16)
    cache_prefix(scheduler.blocks, shared)
    admitted, dropped = request(1, shared + prompt(1, 8)), request(2, shared + prompt(2, 8))
    scheduler.add(admitted)
    scheduler.add(dropped)
    assert scheduler.num_uncached_prefill_tokens() == 16  # 8 + 8: both memoised
    scheduler.waiting.remove(dropped)
    scheduler.finish(dropped)
    batch = scheduler.schedule()
    assert batch.prefills == [(admitted, 8)]
    assert admitted.num_computed_tokens == 16  # the 4 cached blocks served
    assert scheduler._waiting_block_hashes == {} and scheduler._waiting_uncached == {}

# -- #D and decode lanes ----------------------------------------------------------------
def test_decodes_split_over_pp_microbatches_take_all_of_them():
    scheduler = make_scheduler(pp_size=3)
    decodes = [running_decode(scheduler, i) for i in range(7)]
    # #RD=7 over pp=3: lanes of 3, 2, 2 (new decodes join the emptiest lane, lowest first).
    taken = []
    for k in range(3):
        batch = scheduler.schedule(k)
        taken.append(batch.decodes)
        for seq in batch.decodes:
            seq.in_flight = True  # launched: the next microbatches must not take it again
    assert [len(d) for d in taken] == [3, 2, 2]
    assert sorted(s.seq_id for d in taken for s in d) == [s.seq_id for s in decodes]
    assert [s.lane for s in decodes] == [0, 1, 2, 0, 1, 2, 0]
    # Everything is in flight: the next microbatch finds no decode to run.
    assert scheduler.schedule(3).empty


def test_a_lane_without_ready_decodes_lends_its_turn():
    scheduler = make_scheduler(pp_size=2)
    only = running_decode(scheduler, 0)
    # One decode, two lanes: lane 1 is empty, so microbatch 1 takes lane 0's decode
    # (an engine scheduling lanes in turn would otherwise wait on lane 1 for ever).
    assert scheduler.schedule(1).decodes == [only] and only.lane == 0
    only.in_flight = True
    assert scheduler.schedule(0).empty and scheduler.schedule(1).empty


@pytest.mark.parametrize("policy", ["sarathi", "throttle"])
def test_lanes_stay_stable_and_rebalance_only_past_a_difference_of_one(policy):
    scheduler = make_scheduler(pp_size=2, policy=policy)
    seqs = [running_decode(scheduler, i) for i in range(6)]
    assert [s.seq_id for s in scheduler.schedule(0).decodes] == [0, 2, 4]
    assert [s.seq_id for s in scheduler.schedule(1).decodes] == [1, 3, 5]
    scheduler.finish(seqs[1])   # lanes 3 and 2: a difference of one, nothing moves
    assert [s.seq_id for s in scheduler.schedule(0).decodes] == [0, 2, 4]
    assert [s.seq_id for s in scheduler.schedule(1).decodes] == [3, 5]
    seqs[4].in_flight = True    # prefer moving a sequence that can run in its new lane now
    scheduler.finish(seqs[3])   # lanes 3 and 1: rebalance, one sequence moves 0 -> 1
    assert [s.seq_id for s in scheduler.schedule(1).decodes] == [2, 5]
    assert [s.lane for s in seqs if s.status is SequenceStatus.RUNNING] == [0, 1, 0, 1]  # 0, 2, 4, 5
    assert [s.seq_id for s in scheduler.schedule(0).decodes] == [0]  # 4 is in flight


def test_in_flight_sequences_are_never_scheduled_or_preempted():
    # 5 blocks: two decodes of 8 tokens each hold 2 full blocks; a prefill holds 1.
    scheduler = make_scheduler(num_blocks=5, pp_size=2, policy="sarathi")
    growing = running_decode(scheduler, 0, prompt_len=8)   # its 9th token needs a new block
    busy = running_decode(scheduler, 1, prompt_len=8)
    partial = request(2, prompt(2, 12))
    partial.num_computed_tokens, partial.block_table = 4, scheduler.blocks.allocate(1)
    partial.status = SequenceStatus.RUNNING
    scheduler.running.append(partial)
    busy.in_flight = partial.in_flight = True
    assert scheduler.blocks.num_free_blocks == 0
    # Lane 0 holds `growing`. Room for its block must come from a victim: the newest
    # running sequences are in flight, so the only one left is `growing` itself.
    batch = scheduler.schedule(0)
    assert batch.empty and scheduler.num_preemptions == 1
    assert growing.status is SequenceStatus.WAITING
    assert busy.block_table and partial.block_table and busy in scheduler.running
    # Lane 1 holds `busy`, in flight; the in-flight prefill gets no second chunk either
    # (and `growing` cannot be readmitted into 2 free blocks: it needs 3).
    assert scheduler.schedule(1).empty
    scheduler.preempt_all()
    assert scheduler.running == [busy, partial] and scheduler.num_preemptions == 1


# -- end to end ---------------------------------------------------------------------------
PROMPTS = ("A bakery sells muffins for $3 each and cookies for $2 each. Maria buys 4 muffins and some "
           "cookies and spends $20. How many cookies did she buy? Explain step by step.",
           "The sum of two consecutive even integers is 86. What are the two integers? Show the work.",
           "Write a short poem about the moon rising over a quiet harbour town at night.")


def test_throttle_engine_matches_sarathi_greedy(generator_model):
    ids = [generator_model.tokenizer(p)["input_ids"] for p in PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    runs = {}
    for policy in ("sarathi", "throttle"):
        engine = Engine(generator_model.name, EngineConfig(scheduler=SchedulerConfig(policy=policy)),
                        loaded=generator_model)
        runs[policy] = ([o.completions[0].token_ids for o in engine.generate(ids, params)], engine.stats.steps)
    assert runs["throttle"][0] == runs["sarathi"][0]
    # sarathi prefills all three prompts in one step, then decodes 11 more. The prompts
    # hold fewer than #T * #MinP = 256 tokens, so throttle prefills #MinP=32 a step: its
    # prompts take several steps, overlapped with the first decodes.
    assert runs["sarathi"][1] == 12
    assert runs["throttle"][1] > 12
