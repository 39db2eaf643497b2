"""The simulated device: it schedules exactly as the real one for the same tokens, its tokens
follow the recorded profile, a forward takes its modelled time, and a search runs on it."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from tts_runtime.cli import app
from tts_runtime.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig, resolve_device
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import SamplingParams
from tts_runtime.executor.batch import ModelInput
from tts_runtime.executor.sampler import SamplingRow
from tts_runtime.executor.sim import SimDevice, SimExecutor
from tts_runtime.executor.sim_costs import H100_MEMORY, SimCost, SimCosts
from tts_runtime.executor.sim_profile import load_profile
from tts_runtime.executor.sim_tokens import ProfileTokens, ReplayTokens

# Text the model continues (a bare question makes it end at once).
PROMPTS = ["The first five prime numbers are", "Once upon a time, in a small village by the sea,",
           "To solve 3x + 5 = 20, we first", "1, 2, 3, 4,"]


def _run_recording(engine: Engine, params: SamplingParams) -> tuple[list, dict]:
    """Every scheduled batch as (decode seq ids, (prefill seq id, chunk tokens)...), and the outputs."""
    schedule, decisions = engine.scheduler.schedule, []

    def recorded(microbatch: int = 0):
        batch = schedule(microbatch)
        if not batch.empty:
            decisions.append(([s.seq_id for s in batch.decodes], [(s.seq_id, n) for s, n in batch.prefills]))
        return batch

    engine.scheduler.schedule = recorded
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(f"r{i}", prompt, params)
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out
    return decisions, outputs


def test_sim_schedules_as_the_real_device_for_the_same_tokens(generator_model):
    # A small token budget and pool: chunked prefill, and sequences competing for blocks.
    config = EngineConfig(device="cpu", scheduler=SchedulerConfig(max_num_batched_tokens=24),
                          cache=CacheConfig(num_blocks=12, block_size=4))
    params = SamplingParams(temperature=0.0, max_tokens=20)
    real = Engine(generator_model.name, config, loaded=generator_model)
    real_decisions, outputs = _run_recording(real, params)
    streams = {}
    for out in outputs.values():
        (completion,) = out.completions
        eos = [generator_model.tokenizer.eos_token_id] if completion.finish_reason == "eos" else []
        streams[tuple(out.prompt_token_ids)] = list(completion.token_ids) + eos
    executor = SimExecutor(SimDevice(), SimCosts(SimCost(), SimCost()), ReplayTokens(streams))
    # Synchronous, as the CPU device is (async scheduling decides one step ahead).
    sync = replace(config, scheduler=replace(config.scheduler, async_scheduling=False))
    sim = Engine(generator_model.name, sync, loaded=generator_model, executor=executor)
    sim_decisions, sim_outputs = _run_recording(sim, params)
    # Mixed steps and preemption were exercised.
    assert any(prefills and decodes for decodes, prefills in real_decisions) and real.scheduler.num_preemptions
    assert sim_decisions == real_decisions
    assert {k: v.completions[0].token_ids for k, v in sim_outputs.items()} == \
           {k: v.completions[0].token_ids for k, v in outputs.items()}


def test_drawn_steps_follow_the_profile():
    profile = load_profile()
    tokens = ProfileTokens(profile, seed=7)
    prompt = [profile.turn_token_id, 520, 9531, 198]  # an assistant turn with no step yet
    params = SamplingParams(temperature=0.8)
    lengths, eos = [], 0
    for seed in range(1500):
        row = SamplingRow(params, list(prompt), len(prompt), seed, len(prompt))
        while True:
            token = tokens.next_token(row)
            row.token_ids.append(token)
            row.num_tokens += 1
            if token in (profile.separator_token_id, profile.eos_token_id):
                break
        lengths.append(len(row.token_ids) - len(prompt))
        eos += token == profile.eos_token_id
    steps = sum(profile.step_lengths.values())
    expected_mean = sum(k * c for k, c in profile.step_lengths.items()) / steps
    assert abs(sum(lengths) / len(lengths) - expected_mean) < 0.15 * expected_mean
    assert abs(eos / len(lengths) - profile.eos_hazard()[0]) < 0.04
    # A later step index reads its own EOS hazard: after five delimiters the hazard of step 5.
    later = prompt + [profile.separator_token_id] * 5
    assert tokens.step_index(later) == 5


def test_a_forward_takes_its_modelled_time():
    device = SimDevice()
    executor = SimExecutor(device, SimCosts(SimCost(fixed_seconds=0.05), SimCost()), ReplayTokens({}))
    batch = _decode_free_batch()
    start = time.perf_counter()
    futures = [executor.submit(batch) for _ in range(3)]
    assert time.perf_counter() - start < 0.02  # submitting waits for nothing
    futures[-1].result(timeout=5)
    elapsed = time.perf_counter() - start
    assert 0.15 <= elapsed < 0.4  # queued behind each other like one stream
    assert device.busy_seconds == pytest.approx(0.15)


def _decode_free_batch() -> ModelInput:
    from tts_runtime.executor.batch import AttentionMetadata

    empty = torch.zeros(0, dtype=torch.int32)
    meta = AttentionMetadata(torch.zeros(0, dtype=torch.int64), 0, empty.view(0, 0), empty, [], [], [],
                             empty.view(0, 0), 16)
    return ModelInput(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), meta,
                      torch.zeros(0, dtype=torch.int64))


def test_beam_runs_end_to_end_on_the_sim(tmp_path, math500_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["beam", "--limit", "2", "--device", "sim", "--device-memory", "4GiB",
                                      "--num-iterations", "4", "--out", str(out)],
                                env={"TTS_DATA_DIR": str(math500_path.parents[1])})
    assert result.exit_code == 0, result.output
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2
    assert all(json.loads(line)["beams"] for line in lines)


def test_hidden_driver_runs_the_search_to_the_end(generator_model, prm_model, math500_path):
    from tts_runtime.runs.datasets import DatasetConfig, load_problems
    from memory.split import MemoryConfig
    from search.config import SearchConfig
    from search.driver import run_search
    from tts_runtime.config import CohostConfig
    from tts_runtime.cohost.runtime import Runtime

    problems = load_problems(DatasetConfig(dataset_path=str(math500_path), limit=3))
    config = EngineConfig(device="sim", cohost=CohostConfig(phase_policy="batched", hide_driver=True))
    runtime = Runtime(generator_model, prm_model, memory=MemoryConfig(device_memory=4 << 30), engine_config=config)
    try:
        results = run_search(runtime, problems, SearchConfig(num_iterations=4, problem_batch=2))
    finally:
        runtime.shutdown()
    assert [r.id for r in results] == [p.id for p in problems]
    assert all(r.beams for r in results)


def test_the_heap_is_frozen_while_the_search_runs_and_only_then(generator_model, prm_model, math500_path):
    import gc

    from memory.split import MemoryConfig
    from search.config import SearchConfig
    from search.driver import run_search
    from tts_runtime.cohost.runtime import Runtime
    from tts_runtime.config import CohostConfig
    from tts_runtime.runs.datasets import DatasetConfig, load_problems

    problems = load_problems(DatasetConfig(dataset_path=str(math500_path), limit=2))
    for freeze in (True, False):
        config = EngineConfig(device="sim", cohost=CohostConfig(freeze_heap=freeze))
        runtime = Runtime(generator_model, prm_model, memory=MemoryConfig(device_memory=4 << 30), engine_config=config)
        frozen_at_results = []
        try:
            run_search(runtime, problems, SearchConfig(num_iterations=2, problem_batch=2),
                       on_result=lambda result: frozen_at_results.append(gc.get_freeze_count()))
        finally:
            runtime.shutdown()
        assert len(frozen_at_results) == 2
        assert all(count > 0 for count in frozen_at_results) if freeze else frozen_at_results == [0, 0]
        assert gc.get_freeze_count() == 0


def test_overlap_queues_both_engines_on_the_one_device_and_searches_the_same(generator_model, prm_model,
                                                                               math500_path):
    """Under --overlap the generator's next microbatches queue behind the PRM's forward on the
    simulated device's one stream (with --hide-driver as well, both engines launch before the
    woken searches run); tokens and scores do not depend on batch company, so every search ends
    exactly as without either."""
    from memory.split import MemoryConfig
    from search.config import SearchConfig
    from search.driver import run_search
    from tts_runtime.cohost.runtime import Runtime
    from tts_runtime.config import CohostConfig
    from tts_runtime.runs.datasets import DatasetConfig, load_problems

    problems = load_problems(DatasetConfig(dataset_path=str(math500_path), limit=4))
    runs = {}
    for overlap, hide_driver in ((False, False), (True, False), (True, True)):
        cohost = CohostConfig(phase_policy="batched", overlap=overlap, hide_driver=hide_driver)
        config = EngineConfig(device="sim", cohost=cohost)
        runtime = Runtime(generator_model, prm_model, memory=MemoryConfig(device_memory=4 << 30), engine_config=config)
        generator_launch, prm_in_flight = runtime.generator.launch, []

        def launch(*args, runtime=runtime, generator_launch=generator_launch, **kwargs) -> int:
            launched = generator_launch(*args, **kwargs)
            if launched:
                prm_in_flight.append(runtime.prm.num_in_flight)
            return launched

        runtime.generator.launch = launch
        try:
            results = run_search(runtime, problems, SearchConfig(num_iterations=6, problem_batch=4))
        finally:
            runtime.shutdown()
        runs[overlap, hide_driver] = ([{**r.to_dict(), "seconds": 0} for r in results], max(prm_in_flight))
    alone, overlapped, hidden = runs.values()
    assert overlapped[0] == alone[0] and hidden[0] == alone[0]
    assert alone[1] == 0 and overlapped[1] > 0


def test_sim_file_reads_a_bench_fit(tmp_path):
    from tts_runtime.executor.sim import sim_costs_for

    report = {"summary": {"alternate_forward_costs": {
        "generator": {"fixed_seconds": 0.002, "seconds_per_decode": 1e-5, "seconds_per_prefill_token": 0.0},
        "prm": {"fixed_seconds": 0.01, "seconds_per_decode": 0.0, "seconds_per_prefill_token": 2e-6}}}}
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(report))
    costs = sim_costs_for(f"sim:{path}")
    assert costs.generator == SimCost(0.002, 1e-5, 0.0) and costs.prm == SimCost(0.01, 0.0, 2e-6)
    assert costs.device_memory == H100_MEMORY == sim_costs_for("sim").device_memory
    # A fit from another card carries its memory (an H200's NVML total).
    report["summary"]["alternate_forward_costs"]["device_memory"] = 150_754_820_096
    path.write_text(json.dumps(report))
    assert sim_costs_for(f"sim:{path}").device_memory == 150_754_820_096


@pytest.mark.parametrize("text, fragment", [
    ("[]", "needs 'generator' and 'prm' fits"),
    ('{"generator": {"fixed_seconds": 0.1}}', "needs 'generator' and 'prm' fits"),
    ('{"generator": {"fixed_seconds": "x"}, "prm": {}}', "could not convert string to float"),
    ("{not json", "Expecting property name"),
    ('{"generator": {}, "prm": {}, "device_memory": "80GB"}', "invalid literal for int"),
])
def test_a_bad_sim_file_is_a_config_error_naming_it(tmp_path, text, fragment):
    from tts_runtime.executor.sim import sim_costs_for

    path = tmp_path / "fit.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"--device sim:{re.escape(str(path))}: cannot read the cost file") as err:
        sim_costs_for(f"sim:{path}")
    assert fragment in str(err.value)


def test_a_missing_sim_file_is_refused_before_anything_loads(tmp_path):
    with pytest.raises(ConfigError, match="cost file .* does not exist"):
        resolve_device(f"sim:{tmp_path / 'none.json'}")
    with pytest.raises(ConfigError, match="cost file .* is not a file"):
        resolve_device(f"sim:{tmp_path}")
    assert resolve_device("sim") == torch.device("cpu")


def test_a_forwards_cost_adds_every_term_of_its_batch():
    """Two decodes at contexts 10 and 20 beside a 5-token prefill chunk ending at 12."""
    from tts_runtime.executor.batch import AttentionMetadata

    tables = torch.zeros(2, 2, dtype=torch.int32)
    meta = AttentionMetadata(torch.zeros(7, dtype=torch.int64), 2, tables, torch.tensor([10, 20], dtype=torch.int32),
                             [2], [5], [12], tables[:1], 16)
    batch = ModelInput(torch.zeros(7, dtype=torch.int64), torch.zeros(7, dtype=torch.int64), meta,
                       torch.tensor([0, 1, 6]))
    cost = SimCost(fixed_seconds=1.0, seconds_per_decode=0.1, seconds_per_prefill_token=0.01,
                   seconds_per_context_token=0.001, prefill_fixed_seconds=0.5)
    assert cost.seconds(batch) == pytest.approx(1.0 + 0.5 + 2 * 0.1 + 5 * 0.01 + (10 + 20 + 12) * 0.001)
    without_context = SimCost(fixed_seconds=1.0, seconds_per_decode=0.1, seconds_per_prefill_token=0.01)
    assert without_context.seconds(batch) == pytest.approx(1.0 + 2 * 0.1 + 5 * 0.01)


def test_partial_block_reuse_prefills_only_the_prompts_and_searches_the_same(generator_model, prm_model,
                                                                              math500_path):
    """With partial-block reuse each beam's next step continues the KV of the sequence that
    generated its last step (its partial last block is taken over, a forked child copies its
    parent's): after the problems' prompts the generator prefills nothing, every step's first
    token runs as a decode. Tokens and scores on the simulated device do not depend on what
    was cached, so every search ends exactly as with the recompute."""
    from memory.split import MemoryConfig
    from search.config import SearchConfig
    from search.driver import run_search
    from search.prompts import PromptBuilder
    from tts_runtime.cohost.runtime import Runtime
    from tts_runtime.config import CacheConfig, CohostConfig
    from tts_runtime.runs.datasets import DatasetConfig, load_problems

    problems = load_problems(DatasetConfig(dataset_path=str(math500_path), limit=3))
    prompts = PromptBuilder.configured(generator_model.tokenizer, None, None)
    prompt_tokens = sum(len(prompts.prompt_token_ids(p.question)) for p in problems)
    runs = {}
    for reuse in (False, True):
        config = EngineConfig(device="sim", cache=CacheConfig(reuse_partial_blocks=reuse),
                              cohost=CohostConfig(phase_policy="batched"))
        runtime = Runtime(generator_model, prm_model, memory=MemoryConfig(device_memory=4 << 30), engine_config=config)
        try:
            results = run_search(runtime, problems, SearchConfig(num_iterations=6, problem_batch=3))
        finally:
            runtime.shutdown()
        stats = runtime.generator.stats
        runs[reuse] = ([{**r.to_dict(), "seconds": 0} for r in results],
                       stats.computed_tokens - sum(stats.decode_batch_sizes), runtime.generator.blocks.stats.tail_hits)
    (recomputed, prefilled_without, _), (reused, prefilled_with, tail_hits) = runs[False], runs[True]
    assert reused == recomputed
    assert prefilled_with <= prompt_tokens < prefilled_without
    assert tail_hits >= len(problems) * 5  # a step after each of the first five
