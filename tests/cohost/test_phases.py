"""Phase scheduling of the co-hosted pair (tts_runtime/cohost/phases.py) on the real demo models.

A small run whose forwards can be counted by hand: one generate request (n=2, 5 greedy
tokens) and one score request, prompts cut into 16-token prefill chunks. The generator needs
ceil(prompt / 16) prefill forwards (the last samples the first tokens, then forks) and 4
decodes; the PRM ceil(prompt / 16) forwards. Each policy must step the engines in the order
its rule says, and searches must come out the same under every policy."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import pytest
import torch

from evals.bench_cohost import speedup_ceilings
from memory.split import MemoryConfig
from search import SearchConfig, run_search
from tests.helpers import assert_same_search
from tts_runtime.cohost.phases import GENERATOR, PRM, PhaseScheduler
from tts_runtime.cohost.runtime import Runtime, check_cohost
from tts_runtime.config import CohostConfig, ConfigError, EngineConfig, SchedulerConfig, resolve_phase_policy
from tts_runtime.engine.request import SamplingParams, ScoreParams
from tts_runtime.runs.datasets import DatasetConfig, load_problems

CHUNK = 16
QUESTION = "What is the sum of the first ten positive integers? Think step by step."
STEP = "The sum of 1 through 10 is 10 * 11 / 2 = 55.\n\n"


def _runtime(generator_model, prm_model, **cohost) -> Runtime:
    config = EngineConfig(scheduler=SchedulerConfig(max_prefill_chunk=CHUNK), cohost=CohostConfig(**cohost))
    return Runtime(generator_model, prm_model, memory=MemoryConfig(device_memory=3 << 30), engine_config=config)


def _forward_order(runtime: Runtime) -> str:
    """Submit the small workload and step until done: 'G'/'P' per forward, in order."""
    gen, prm = runtime.generator, runtime.prm
    order = []

    async def run() -> None:
        gen_prompt = gen.tokenize(QUESTION)
        prm_prompt = prm.tokenize(QUESTION + "\n" + STEP)
        futures = [runtime.submit_generate(gen_prompt, SamplingParams(temperature=0, n=2, max_tokens=5,
                                                                      ignore_eos=True)),
                   runtime.submit_score(prm_prompt, ScoreParams(positions=(len(prm_prompt) - 1,),
                                                                candidate_token_ids=(1, 2)))]
        while runtime.busy:
            before = (gen.stats.steps, prm.stats.steps)
            runtime.step()
            order.append("G" * (gen.stats.steps - before[0]) + "P" * (prm.stats.steps - before[1]))
        await asyncio.gather(*futures)

    asyncio.run(run())
    return "".join(order)


def _expected_counts(runtime: Runtime) -> tuple[int, int]:
    gen_prompt = runtime.generator.tokenize(QUESTION)
    prm_prompt = runtime.prm.tokenize(QUESTION + "\n" + STEP)
    return math.ceil(len(gen_prompt) / CHUNK) + 4, math.ceil(len(prm_prompt) / CHUNK)


def _transitions(order: str) -> int:
    return sum(a != b for a, b in zip(order, order[1:]))


CASES = {
    # every step: the generator, then the PRM, while each has work
    "alternate": (dict(), lambda g, p: "".join(("G" if i < g else "") + ("P" if i < p else "")
                                               for i in range(max(g, p)))),
    # with no low water, the generator runs dry before the PRM's 2048-token buffer fills: all
    # of it, then the PRM
    "batched, generator runs dry": (dict(phase_policy="batched", generator_low_water=0),
                                    lambda g, p: "G" * g + "P" * p),
    # the PRM's buffer (1 token) is full from the start: the PRM drains first
    "prm buffer full": (dict(phase_policy="batched", prm_buffer_tokens=1), lambda g, p: "P" * p + "G" * g),
    # two unfinished generator sequences are under the default low-water mark (4): the PRM first
    "batched": (dict(phase_policy="batched"), lambda g, p: "P" * p + "G" * g),
    # ... and at a low-water mark of 2
    "generator at low water": (dict(phase_policy="batched", generator_low_water=2),
                               lambda g, p: "P" * p + "G" * g),
    # both buffers full at every step: the phase flips each step until the PRM is drained
    "both buffers full": (dict(phase_policy="batched", prm_buffer_tokens=1, generator_buffer_seqs=2),
                          lambda g, p: "PG" * p + "G" * (g - p)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_phase_policy_steps_the_engines_by_its_rule(generator_model, prm_model, case):
    cohost, expected = CASES[case]
    runtime = _runtime(generator_model, prm_model, **cohost)
    try:
        gen_forwards, prm_forwards = _expected_counts(runtime)
        assert gen_forwards > prm_forwards > 1  # the shapes the expectations above assume
        order = _forward_order(runtime)
        assert order == expected(gen_forwards, prm_forwards)
        assert runtime.transitions == _transitions(order)
        counters = runtime.cohost_counters()
        assert (counters.generator.forwards, counters.prm.forwards) == (gen_forwards, prm_forwards)
    finally:
        runtime.shutdown()


@dataclass
class _Load:
    """An engine's load as the phase rule reads it."""

    num_unfinished_sequences: int
    pending_tokens: int = 0

    def pending_prefill_tokens(self) -> int:
        return self.pending_tokens


@pytest.mark.parametrize("overlap", [False, True])
def test_batched_phases_under_overlap_only_hold_back_the_prm(overlap):
    """Without overlap a phase is a turn of one engine; overlapped, the generator decodes in
    every step and the phase only says when the PRM launches."""
    phases = PhaseScheduler(CohostConfig(phase_policy="batched", prm_buffer_tokens=100, overlap=overlap))
    both = {GENERATOR, PRM}
    generator, prm = _Load(8), _Load(0, pending_tokens=50)
    engines = {GENERATOR: generator, PRM: prm}
    prm_phase = [GENERATOR, PRM] if overlap else [PRM]
    assert phases.choose(both, engines) == [GENERATOR]  # the PRM's buffer is not full: it waits
    prm.pending_tokens = 100
    assert phases.choose(both, engines) == prm_phase  # full: the PRM's phase begins
    prm.pending_tokens = 10
    assert phases.choose(both, engines) == prm_phase  # and lasts until the PRM is drained
    assert phases.choose({GENERATOR}, engines) == [GENERATOR]
    assert phases.choose(both, engines) == [GENERATOR]  # buffering again
    generator.num_unfinished_sequences = 0
    assert phases.choose({PRM}, engines) == [PRM]  # the generator ran dry


def test_auto_phase_policy_is_batched_on_a_gpu_only(search_runtime):
    assert resolve_phase_policy("auto", torch.device("cuda")) == "batched"
    assert resolve_phase_policy("auto", torch.device("cuda"), backend="vllm") == "alternate"
    assert resolve_phase_policy("auto", torch.device("cpu")) == "alternate"
    assert resolve_phase_policy("batched", torch.device("cpu")) == "batched"
    assert CohostConfig().phase_policy == "auto"
    check_cohost("vllm", "static", CohostConfig())  # auto on vLLM is alternate: no error
    assert search_runtime.cohost.phase_policy == "alternate"  # a CPU runtime built with the default


def test_bad_phase_settings_are_one_line_errors():
    with pytest.raises(ConfigError, match="unknown phase policy 'seesaw'; choose auto, alternate or batched"):
        CohostConfig(phase_policy="seesaw")
    with pytest.raises(ConfigError, match="--prm-buffer-tokens must be >= 1"):
        CohostConfig(prm_buffer_tokens=0)
    with pytest.raises(ConfigError, match="--generator-low-water must be >= 0"):
        CohostConfig(generator_low_water=-1)


# -- searches ---------------------------------------------------------------------------------

SEEDED = SearchConfig(n=4, beam_width=2, num_iterations=2, max_step_tokens=40, max_tokens=48, eos_sampling=False,
                      problem_batch=2, temperature=0.8, seed=7)


@pytest.fixture(scope="module")
def policy_runs(generator_model, prm_model, math500_path):
    problems = load_problems(DatasetConfig(dataset_path=str(math500_path), limit=2))
    runs = {}
    for policy in ("alternate", "batched"):
        runtime = Runtime(generator_model, prm_model, memory=MemoryConfig(device_memory=3 << 30),
                          engine_config=EngineConfig(cohost=CohostConfig(phase_policy=policy)))
        try:
            results = run_search(runtime, problems, SEEDED)
            runs[policy] = (results, runtime.cohost_counters())
        finally:
            runtime.shutdown()
    return runs


@pytest.mark.slow
def test_search_results_do_not_depend_on_the_phase_policy(policy_runs):
    (alternate, _), (batched, _) = policy_runs["alternate"], policy_runs["batched"]
    assert_same_search(alternate, batched)


@pytest.mark.slow
def test_batched_phases_switch_only_when_a_side_runs_dry(policy_runs):
    """Two problems never fill the 2048-token PRM buffer (8 beams of ~110 tokens), so each
    iteration is one generator phase (until every search waits on scores) and one PRM phase
    (until it is drained): at most 2 x iterations - 1 switches, and never more than
    alternating. (Two problems with the same step cap run in step under alternation too, so
    this workload cannot show batching beating it: `tts bench cohost` measures that.)"""
    (_, alternate), (_, batched) = policy_runs["alternate"], policy_runs["batched"]
    assert batched.transitions <= 2 * SEEDED.num_iterations - 1
    assert batched.transitions <= alternate.transitions
    assert batched.prm.sequences / batched.prm.forwards >= alternate.prm.sequences / alternate.prm.forwards


@pytest.mark.slow
def test_device_busy_adds_the_engines_up_when_their_forwards_take_turns(policy_runs):
    """One process on a CPU: a forward runs inside its launch, so the two engines' forwards
    never overlap and the device-wide clock is the sum of the engines' own."""
    for _, counters in policy_runs.values():
        both = counters.generator.busy_seconds + counters.prm.busy_seconds
        assert counters.busy_seconds == pytest.approx(both, rel=1e-3) and both > 0


def test_cohost_bench_ceilings_follow_from_the_busy_fractions():
    """The 20-problem run of docs/benchmarks/cohost.md: the alternating run's forwards
    filled 97.8% of it (one process can gain at most 1.02x), and overlapped, the generator's
    one-thread forwards alone took 90.3% of a run that was 0.798x as fast (at most 0.88x), and
    both engines' one-thread forwards packed onto the two cores would still take 0.87 of the
    alternating run (at most 1.15x). Were the same tokens run in the widest forwards, taking
    0.6 of the alternating run instead of its 0.978, it would gain 1/(0.022 + 0.6)."""
    rows = {"alternate": {"speedup": 1.0, "generator_busy": 0.648, "prm_busy": 0.330, "busy_if_widest": 0.6},
            "overlap": {"speedup": 0.798, "generator_busy": 0.903, "prm_busy": 0.490}}
    ceilings = speedup_ceilings(rows, cores_split=True)
    assert ceilings["one_process"] == pytest.approx(1.022, abs=1e-3)
    assert ceilings["overlap"] == pytest.approx(0.884, abs=1e-3)
    assert ceilings["any_schedule"] == pytest.approx(1.146, abs=1e-3)
    assert ceilings["widest_forwards"] == pytest.approx(1 / 0.622, abs=1e-3)
    assert "overlap" not in speedup_ceilings({"alternate": rows["alternate"]}, cores_split=True)
    # CUDA streams share the whole device: no packing bound there.
    assert "any_schedule" not in speedup_ceilings(rows, cores_split=False)
