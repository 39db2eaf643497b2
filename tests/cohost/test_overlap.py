"""Overlapped generator and PRM (tts_runtime/cohost/overlap.py) with real worker processes.

On CPU each engine's forward runs in a process of its own; a search must come out exactly as
without overlap, both processes must really compute, and a killed worker must end the run
with one line naming it. The CUDA-stream path runs only where there is a GPU."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from memory.split import MemoryConfig
from search import SearchConfig, run_search
from tests.helpers import assert_same_search
from tts_runtime.cohost.runtime import Runtime, check_cohost
from tts_runtime.config import CohostConfig, ConfigError, EngineConfig, ParallelConfig
from tts_runtime.executor.pipeline.pipeline import PipelineFailure
from tts_runtime.runs.datasets import DatasetConfig, load_problems

SEEDED = SearchConfig(n=4, beam_width=2, num_iterations=2, max_step_tokens=24, max_tokens=32, eos_sampling=False,
                      problem_batch=2, temperature=0.8, seed=7)


def _runtime(generator_model, prm_model, overlap: bool, device: str = "cpu", pp: int = 1) -> Runtime:
    # One thread per worker, and one in the driver without overlap: the same kernels run
    # the same sums, so logits agree to the bit.
    config = EngineConfig(device=device, cohost=CohostConfig(overlap=overlap))
    return Runtime(generator_model, prm_model, memory=MemoryConfig(device_memory=3 << 30), engine_config=config,
                   parallel=ParallelConfig(pp_size=pp, threads_per_stage=1))


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def problems(math500_path):
    return load_problems(DatasetConfig(dataset_path=str(math500_path), limit=2))


@pytest.fixture(scope="module")
def overlap_runs(generator_model, prm_model, problems):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        plain = _runtime(generator_model, prm_model, overlap=False)
        try:
            alone = run_search(plain, problems, SEEDED)
        finally:
            plain.shutdown()
    finally:
        torch.set_num_threads(threads)
    runtime = _runtime(generator_model, prm_model, overlap=True)
    try:
        pids = [group.processes[0].pid for group in runtime.workers]
        before = [_cpu_seconds(pid) for pid in pids]
        overlapped = run_search(runtime, problems, SEEDED)
        cpu = [_cpu_seconds(pid) - start for pid, start in zip(pids, before)]
        counters = runtime.cohost_counters()
    finally:
        runtime.shutdown()
    return alone, overlapped, pids, cpu, counters


@pytest.mark.slow
def test_overlap_changes_no_search_result(overlap_runs):
    alone, overlapped = overlap_runs[:2]
    assert_same_search(alone, overlapped)


@pytest.mark.slow
def test_both_worker_processes_really_compute(overlap_runs):
    _, _, pids, cpu, counters = overlap_runs
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert min(cpu) > 0.5, cpu  # each worker process ran its model's forwards
    assert counters.generator.forwards > 0 and counters.prm.forwards > 0
    assert counters.generator.busy_seconds > 0 and counters.prm.busy_seconds > 0
    # Both engines' forwards in flight at once: the device-wide clock counts that time once.
    busy = (counters.generator.busy_seconds, counters.prm.busy_seconds)
    assert max(busy) <= counters.busy_seconds < sum(busy)


def test_a_killed_worker_is_a_one_line_error(generator_model, prm_model, problems):
    runtime = _runtime(generator_model, prm_model, overlap=True)
    pids = [group.processes[0].pid for group in runtime.workers]
    try:
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(PipelineFailure) as failure:
            run_search(runtime, problems[:1], SEEDED)
        assert time.monotonic() - killed < 5.0
        assert str(failure.value) == f"prm worker stage 0 (pid {pids[1]}) killed by SIGKILL"
    finally:
        runtime.shutdown()
    assert not Path(f"/proc/{pids[0]}").exists() or "Z" in Path(f"/proc/{pids[0]}/stat").read_text().split()[2]


def test_overlap_refuses_settings_it_cannot_run():
    with pytest.raises(ConfigError, match="elastic"):
        check_cohost("native", "elastic", CohostConfig(overlap=True))
    with pytest.raises(ConfigError, match="--backend native"):
        check_cohost("vllm", "static", CohostConfig(phase_policy="batched"))
    check_cohost("native", "auto", CohostConfig(overlap=True, phase_policy="batched"))


@pytest.mark.slow
def test_pp2_overlap_launches_both_models_into_the_pipeline(generator_model, prm_model, problems):
    greedy = SearchConfig(n=2, beam_width=2, num_iterations=2, max_step_tokens=24, max_tokens=48,
                          eos_sampling=False, problem_batch=1, temperature=0.0)
    results = {}
    for overlap in (False, True):
        runtime = _runtime(generator_model, prm_model, overlap=overlap, pp=2)
        try:
            results[overlap] = run_search(runtime, problems[:1], greedy)
            counters = runtime.cohost_counters()
        finally:
            runtime.shutdown()
    assert counters.generator.forwards > 0 and counters.prm.forwards > 0
    for a, b in zip(results[False], results[True]):
        assert [beam.steps for beam in a.beams] == [beam.steps for beam in b.beams]
        assert a.prediction == b.prediction


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_streams_change_no_search_result(problems):
    from tts_runtime.models.loader import load_model

    generator = load_model("smollm2-135m-instruct", torch.float32, torch.device("cuda"))
    prm = load_model("gemma3-270m", torch.float32, torch.device("cuda"))
    greedy = SearchConfig(n=4, beam_width=2, num_iterations=2, max_step_tokens=40, max_tokens=48,
                          eos_sampling=False, problem_batch=2, temperature=0.0)
    results = {}
    for overlap in (False, True):
        runtime = _runtime(generator, prm, overlap=overlap, device="cuda")
        try:
            results[overlap] = run_search(runtime, problems, greedy)
            counters = runtime.cohost_counters()
        finally:
            runtime.shutdown()
    assert counters.generator.busy_seconds > 0 and counters.prm.busy_seconds > 0
    for a, b in zip(results[False], results[True]):
        assert [beam.steps for beam in a.beams] == [beam.steps for beam in b.beams]
