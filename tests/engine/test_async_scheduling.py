"""Async scheduling on the simulated device, and on the local executor sampling on its side
(--executor-sampling): step N+1 is scheduled and built while step N runs, and the results are
exactly those of the synchronous engine: no token after a sequence's end, no block left behind,
aborts mid-flight included."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tts_runtime.config import CacheConfig, CohostConfig, ConfigError, EngineConfig, ParallelConfig, SchedulerConfig
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import SamplingParams
from tts_runtime.executor.sim import SimDevice, SimExecutor
from tts_runtime.executor.sim_costs import SimCost, SimCosts
from tts_runtime.executor.sim_profile import load_profile
from tts_runtime.executor.sampler import SamplingRow
from tts_runtime.executor.sampling_executor import SamplingExecutor
from tts_runtime.executor.sim_tokens import ProfileTokens

PROMPTS = ["The first five prime numbers are", "Once upon a time, in a small village by the sea,",
           "To solve 3x + 5 = 20, we first", "1, 2, 3, 4,", "Let x be the number of apples. Then"]


class _SeenRows(ProfileTokens):
    """The profile's draws, remembering every sequence a token was drawn after."""

    def __init__(self) -> None:
        super().__init__(load_profile(), seed=3)
        self.seen: list[tuple[int, ...]] = []

    def next_token(self, row: SamplingRow) -> int:
        self.seen.append(tuple(row.tokens()))
        return super().next_token(row)


def _engine(generator_model, async_scheduling: bool, num_blocks: int = 64) -> Engine:
    # A small token budget and pool: chunked prefill and preemption happen.
    config = EngineConfig(device="cpu", cache=CacheConfig(num_blocks=num_blocks, block_size=4),
                          scheduler=SchedulerConfig(max_num_batched_tokens=24, async_scheduling=async_scheduling))
    executor = SimExecutor(SimDevice(), SimCosts(SimCost(), SimCost()), _SeenRows())
    return Engine(generator_model.name, config, loaded=generator_model, executor=executor)


def _params(index: int) -> SamplingParams:
    """Each request ends its own way: the step delimiter (a stop token), EOS or the length;
    one forks into children."""
    profile = load_profile()
    stop = [profile.separator_token_id] if index % 2 else []
    return SamplingParams(temperature=0.8, seed=index, max_tokens=12 + 7 * index, stop_token_ids=stop,
                          n=3 if index == 1 else 1)


def _run(engine: Engine, abort: str | None = None) -> dict[str, list]:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, _params(i))
    outputs, steps = {}, 0
    while engine.has_unfinished_requests():
        steps += 1
        if steps == 6 and abort is not None:
            engine.abort_request(abort)
        for out in engine.step():
            outputs[out.request_id] = [(c.token_ids, c.finish_reason) for c in out.completions]
    while engine.num_in_flight:  # a microbatch launched ahead for sequences that have all ended
        assert engine.collect() == []
    return outputs


def _assert_no_leak(engine: Engine) -> None:
    blocks = engine.blocks
    assert blocks.num_used_blocks == 0 and blocks.num_free_blocks == engine.num_blocks
    assert not engine.scheduler.running and not engine.scheduler.waiting


def test_async_gives_the_synchronous_outputs_and_runs_ahead(generator_model):
    sync = _engine(generator_model, async_scheduling=False)
    expected = _run(sync)
    engine = _engine(generator_model, async_scheduling=True)
    assert engine.async_scheduling
    assert _run(engine) == expected
    reasons = {reason for completions in expected.values() for _, reason in completions}
    assert reasons >= {"stop", "length"}
    # Decodes went ahead: two microbatches in flight at a launch, which the synchronous engine never has.
    assert max(engine.stats.in_flight_at_launch) == 2 and max(sync.stats.in_flight_at_launch) == 1
    # The executor drew each token after the same sequence as the synchronous engine: the
    # placeholders were filled. The only extra draws follow a sequence's last token (dropped).
    seen, extra = set(sync.executor.tokens.seen), set(engine.executor.tokens.seen) - set(sync.executor.tokens.seen)
    assert seen <= set(engine.executor.tokens.seen)
    ends = {load_profile().separator_token_id, *engine.eos_token_ids}
    assert extra and all(tokens[-1] in ends for tokens in extra)
    _assert_no_leak(engine)


def test_ended_sequences_leak_no_token_and_no_block_under_preemption(generator_model):
    sync = _engine(generator_model, async_scheduling=False, num_blocks=14)
    expected = _run(sync)
    engine = _engine(generator_model, async_scheduling=True, num_blocks=14)
    assert _run(engine) == expected
    assert engine.scheduler.num_preemptions and sync.scheduler.num_preemptions
    for completions in expected.values():
        for tokens, reason in completions:
            if reason == "stop":  # nothing after the stop token
                assert tokens[-1] == load_profile().separator_token_id
    _assert_no_leak(engine)


def test_a_request_aborted_in_flight_stops_and_frees_its_blocks(generator_model):
    expected = _run(_engine(generator_model, async_scheduling=False), abort="r4")
    engine = _engine(generator_model, async_scheduling=True)
    assert _run(engine, abort="r4") == expected
    assert "r4" not in expected
    _assert_no_leak(engine)


def test_the_local_executor_stays_synchronous(generator_model):
    config = EngineConfig(device="cpu", scheduler=SchedulerConfig(async_scheduling=True))
    engine = Engine(generator_model.name, config, loaded=generator_model)
    assert not engine.async_scheduling


# -- the local executor sampling on its side: real forwards, real sampling -------------------

def _local_engine(generator_model, *, executor_sampling: bool, async_scheduling: bool,
                  num_blocks: int = 64) -> Engine:
    config = EngineConfig(device="cpu", cache=CacheConfig(num_blocks=num_blocks, block_size=4),
                          scheduler=SchedulerConfig(max_num_batched_tokens=24, async_scheduling=async_scheduling),
                          executor_sampling=executor_sampling)
    return Engine(generator_model.name, config, loaded=generator_model)


def _real_params(index: int, stops: list[int], seeded: bool = True) -> SamplingParams:
    """_params with stop tokens the real model emits, a row with penalties (its placeholder is
    read on the host) and a greedy one."""
    params = _params(index)
    if params.stop_token_ids:
        params = replace(params, stop_token_ids=stops)
    if index == 3:
        params = replace(params, repetition_penalty=1.3, frequency_penalty=0.2)
    if index == 4:
        params = replace(params, temperature=0.0)
    return params if seeded else replace(params, seed=None)


def _run_real(engine: Engine, seeded: bool = True) -> dict[str, list]:
    stops = [engine.tokenizer.convert_tokens_to_ids(t) for t in (",", ".")]
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, _real_params(i, stops, seeded))
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = [(c.token_ids, c.finish_reason) for c in out.completions]
    while engine.num_in_flight:
        assert engine.collect() == []
    return outputs


def test_executor_sampling_draws_what_the_engine_draws(generator_model):
    """Synchronous, unseeded rows included: the executor's generator gives the engine's draws."""
    expected = _run_real(_local_engine(generator_model, executor_sampling=False, async_scheduling=False),
                         seeded=False)
    engine = _local_engine(generator_model, executor_sampling=True, async_scheduling=False)
    assert isinstance(engine.executor, SamplingExecutor) and not engine.async_scheduling
    assert _run_real(engine, seeded=False) == expected


@pytest.mark.parametrize("num_blocks", [64, 14], ids=["roomy", "preempting"])
def test_executor_sampling_runs_ahead_with_the_synchronous_results(generator_model, num_blocks):
    """Async scheduling acts on the local executor once it samples: two microbatches in flight,
    going-ahead decodes filled from the previous forward's tokens (penalties on the host), and
    every completion equals the engine-sampled synchronous run's."""
    sync = _local_engine(generator_model, executor_sampling=False, async_scheduling=True, num_blocks=num_blocks)
    expected = _run_real(sync)
    engine = _local_engine(generator_model, executor_sampling=True, async_scheduling=True, num_blocks=num_blocks)
    assert engine.async_scheduling and not sync.async_scheduling
    assert _run_real(engine) == expected
    assert max(engine.stats.in_flight_at_launch) == 2
    if num_blocks == 14:
        assert engine.scheduler.num_preemptions
    reasons = {reason for completions in expected.values() for _, reason in completions}
    assert reasons >= {"stop", "length"}
    _assert_no_leak(engine)


def test_executor_sampling_with_forwards_elsewhere_is_a_one_line_error():
    for elsewhere in ({"parallel": ParallelConfig(pp_size=2)}, {"cohost": CohostConfig(overlap=True)}):
        with pytest.raises(ConfigError, match="--executor-sampling samples in the driver's local executor"):
            EngineConfig(executor_sampling=True, **elsewhere)


def test_the_gpu_host_hiding_configuration_searches_as_batched_does(generator_model, prm_model, math500_path):
    """`tts bench cohost`'s "batched + executor sampling + hide driver" (what hid the host on
    the simulated H100, for a GPU run) on the real demo models: the generator runs ahead two
    microbatches deep, and the beams are those of the batched policy alone."""
    from memory.split import MemoryConfig
    from search.config import SearchConfig
    from search.driver import run_search
    from tts_runtime.cohost.runtime import Runtime
    from tts_runtime.runs.datasets import DatasetConfig, load_problems

    problems = load_problems(DatasetConfig(dataset_path=str(math500_path), limit=3))
    search = SearchConfig(num_iterations=3, max_step_tokens=48, max_tokens=96, problem_batch=3)
    runs = []
    for hidden in (False, True):
        config = EngineConfig(device="cpu", cohost=CohostConfig(phase_policy="batched", hide_driver=hidden),
                              executor_sampling=hidden)
        runtime = Runtime(generator_model, prm_model, memory=MemoryConfig(device_memory=3 << 30), engine_config=config)
        try:
            runs.append([{**result.to_dict(), "seconds": 0} for result in run_search(runtime, problems, search)])
        finally:
            runtime.shutdown()
        ahead = max(runtime.generator.stats.in_flight_at_launch)
        assert (isinstance(runtime.generator.executor, SamplingExecutor), ahead) == ((True, 2) if hidden else (False, 1))
    assert runs[1] == runs[0]
