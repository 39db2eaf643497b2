"""Scale-out on Ray with real processes: a local Ray cluster started and stopped by this
module, replicas of the real demo models, real MATH-500 problems, tiny greedy searches.

Replicas load the models from the on-disk cache (~/.cache/tts) in their own processes;
the cluster has 2 CPUs, so two replicas of one thread each fit, as on CI's 2-core box."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

# Ray is a dependency of the project (CI has it); a GPU image without it must still be able
# to collect the rest of the suite (`pytest -m gpu tests/`).
ray = pytest.importorskip("ray", reason="scale-out tests need Ray (pip install ray)")

from memory.split import MemoryConfig
from tts_runtime.options import parse_size
from search import ProblemResult, SearchConfig
from tests.helpers import GENERATOR, PRM
from tts_runtime.cli import app
from tts_runtime.config import EngineConfig, ModelSpec
from tts_runtime.runs.datasets import DatasetConfig, load_problems
from tts_runtime.runs.ray_pool import ReplicaInfo, ReplicaPool, WorkItem, ray_cluster
from tts_runtime.runs.run import RunOutcome
from tts_runtime.runs.run_folder import METRICS_FILE, RESULTS_FILE, RunFolder
from tts_runtime.runs.scale_config import ScaleOut
from tts_runtime.runs.scaleout import ReplicaSpec, run_scaled

# Greedy, so a problem's result cannot depend on which replica solved it or what it shared
# a batch with; two problems in flight per replica exercise the replica's own batching.
SEARCH = SearchConfig(method="beam", n=2, beam_width=2, num_iterations=2, max_step_tokens=16, max_tokens=48,
                      temperature=0.0, problem_batch=2)
# fp32: its kernels compute a row the same whatever else is in the batch; in bf16 the
# projections switch kernels with the row count, so a batch-mate can change the rounding.
# oneDNN on any CPU: 2.1 GiB is sized for weights without a packed copy.
SPEC = ReplicaSpec(ModelSpec(GENERATOR, "float32"), ModelSpec(PRM, "float32"), MemoryConfig(device_memory=parse_size("2.1GiB")),
                   EngineConfig(device="cpu", linear_backend="onednn"))
CLI_TINY = ["--n", "2", "--beam-width", "2", "--num-iterations", "2", "--max-step-tokens", "16", "--max-tokens", "48",
            "--temperature", "0", "--problem-batch", "1", "--device", "cpu", "--device-memory", "2.1GiB",
            "--linear-backend", "onednn"]


@pytest.fixture(scope="module")
def cluster() -> str:
    """A 2-CPU local cluster for this module, started as a run starts one; yields its address
    for drivers in subprocesses."""
    # The shared development box runs close to its memory limit because of other work;
    # Ray's memory monitor would then kill replicas that are well within their own share.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    assert not ray.is_initialized()
    with ray_cluster(ScaleOut(replicas=2)):
        yield ray.get_runtime_context().gcs_address


def test_local_cluster_listens_on_loopback_only(cluster):
    assert cluster.startswith("127.0.0.1:")
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}

    @ray.remote(num_cpus=1)
    def node_ip() -> str:
        return ray.util.get_node_ip_address()

    assert ray.get(node_ip.remote()) == "127.0.0.1"


@pytest.fixture(scope="module")
def problems(math500_path: Path):
    return load_problems(DatasetConfig(dataset_path=str(math500_path), limit=3))


def _run(folder: Path, problems, replicas: int, **hooks) -> RunOutcome:
    return run_scaled(SPEC, problems, SEARCH, RunFolder.open(folder, resume=False), ScaleOut(replicas=replicas),
                      **hooks)


def _ids(folder: Path) -> list[str]:
    return [json.loads(line)["id"] for line in (folder / RESULTS_FILE).read_text().splitlines()]


def _same_search(a: ProblemResult, b: ProblemResult) -> None:
    assert (a.prediction, a.correct, a.generated_tokens) == (b.prediction, b.correct, b.generated_tokens), a.id
    assert [beam.steps for beam in a.beams] == [beam.steps for beam in b.beams], a.id
    assert [beam.score for beam in a.beams] == pytest.approx([beam.score for beam in b.beams], abs=1e-4), a.id


@pytest.fixture(scope="module")
def one_replica(cluster, problems, tmp_path_factory) -> dict[str, ProblemResult]:
    folder = tmp_path_factory.mktemp("one-replica")
    outcome = _run(folder, problems, 1)
    assert sorted(_ids(folder)) == sorted(p.id for p in problems)
    return {result.id: result for result in outcome.new}


def test_two_replicas_give_the_results_of_one(cluster, problems, one_replica, tmp_path):
    outcome = _run(tmp_path, problems, 2)
    assert sorted(_ids(tmp_path)) == sorted(one_replica)
    for result in outcome.new:
        _same_search(result, one_replica[result.id])
    scale = outcome.metrics["scaleout"]
    assert scale["replicas"] == 2 and scale["retries"] == 0 and scale["failed"] == []
    # Both replicas took problems from the one queue; the run folder is an ordinary one.
    assert all(replica["done"] >= 1 for replica in scale["per_replica"])
    assert outcome.metrics["problems"] == 3 and outcome.metrics["throughput"]["generated_tokens"] > 0
    # search-and-learn's completions file and accuracy at every k, as a one-process run writes them.
    assert len((tmp_path / "beam_search_completions.jsonl").read_text().splitlines()) == 3
    assert "weighted@1" in outcome.metrics["accuracy_at_k"] and outcome.metrics["grader"] == "math-verify"


def test_a_killed_replica_is_restarted_and_its_problems_requeued(cluster, problems, one_replica, tmp_path):
    pools: list[ReplicaPool] = []
    killed: list[int] = []

    def kill_a_busy_replica(result: ProblemResult) -> None:
        busy = [r for r in pools[0].replicas if r.in_flight and r.state == "ready"]
        if not killed and busy:
            os.kill(busy[0].info.pid, signal.SIGKILL)
            killed.append(busy[0].index)

    outcome = _run(tmp_path, problems, 2, on_start=lambda pool, todo: pools.append(pool),
                   on_result=kill_a_busy_replica)
    assert killed, "no replica had a problem in flight when the first result came back"
    assert sorted(_ids(tmp_path)) == sorted(one_replica)  # every problem, each once
    for result in outcome.new:
        _same_search(result, one_replica[result.id])
    scale = outcome.metrics["scaleout"]
    assert scale["retries"] >= 1 and scale["replica_restarts"] == 1 and scale["failed"] == []
    assert json.loads((tmp_path / METRICS_FILE).read_text())["scaleout"]["retries"] == scale["retries"]


def test_driver_sigkill_then_resume_loses_nothing_and_repeats_nothing(cluster, math500_path, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "tts_runtime.cli", "beam", "--dataset-path", str(math500_path),
               "--limit", "3", *CLI_TINY, "--replicas", "1", "--ray-address", cluster, "--out", str(out)]
    driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while not ((out / RESULTS_FILE).exists() and (out / RESULTS_FILE).read_text().count("\n") >= 1):
            assert driver.poll() is None and time.monotonic() < deadline, "the driver ended before a result"
            time.sleep(0.2)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.kill()
        driver.wait()
    before = _ids(out)
    assert 1 <= len(before) < 3
    # The dead driver owned its replica: Ray ends it and the cluster's CPUs come free.
    deadline = time.monotonic() + 120
    while ray.available_resources().get("CPU", 0) < 2:
        assert time.monotonic() < deadline, "the killed driver's replica still holds its CPU"
        time.sleep(0.5)
    resumed = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    after = _ids(out)
    assert after[:len(before)] == before and sorted(set(after)) == sorted(after) and len(after) == 3
    metrics = json.loads((out / METRICS_FILE).read_text())
    assert metrics["problems"] == 3 and metrics["throughput"]["problems"] == 3 - len(before)


@pytest.mark.parametrize("args, fragment", [
    (["--replicas", "0"], "--replicas must be >= 1"),
    (["--replicas", "1", "--threads-per-replica", "0"], "--threads-per-replica must be >= 1"),
    (["--replicas", "2", "--threads-per-replica", "2"], "the Ray cluster has 2 CPUs; 2 replicas need 4"),
])
def test_bad_scaleout_input_is_one_line(cluster, math500_path, args, fragment, tmp_path):
    result = CliRunner().invoke(app, ["beam", "--dataset-path", str(math500_path), "--limit", "1", *CLI_TINY,
                                      "--out", str(tmp_path / "run"), *args])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert fragment in lines[0]


def test_sweep_memory_runs_its_settings_on_replicas(cluster, math500_path, tmp_path):
    result = CliRunner().invoke(app, [
        "sweep-memory", "--splits", "0.3,0.5", "--policies", "static", "--dataset-path", str(math500_path),
        "--limit", "1", "--num-iterations", "1", "--max-step-tokens", "8", "--n", "2", "--beam-width", "2",
        "--device", "cpu", "--device-memory", "2.1GiB", "--linear-backend", "onednn", "--replicas", "2",
        "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    assert [row["setting"] for row in rows] == ["static 0.30", "static 0.50"]
    assert all(row["problems"] == 1 and not row["error"] for row in rows)


# -- replica deaths and hangs, on light actors (tts_runtime/runs/ray_pool.py) ----------------------

class LightReplica:
    """A replica without models: `crash*` kills its process, `hang*` never returns (a sync
    actor runs one call at a time, so it answers no heartbeat either), `raise*` raises."""

    def ready(self) -> ReplicaInfo:
        return ReplicaInfo.here()

    def solve(self, key: str) -> str:
        if key.startswith("crash"):
            os._exit(1)
        if key.startswith("hang"):
            time.sleep(3600)
        if key.startswith("raise"):
            raise ValueError(f"bad problem {key}")
        time.sleep(0.2)
        return key.upper()


def _serve(keys: list[str], per_replica: int, hang_timeout_s: float | None = None):
    # Workers cannot import this test module by its name: Ray ships the class itself.
    ray.cloudpickle.register_pickle_by_value(sys.modules[LightReplica.__module__])
    pool = ReplicaPool(LightReplica, (), ScaleOut(replicas=2), per_replica=per_replica,
                       hang_timeout_s=hang_timeout_s)
    items = {key: WorkItem(key, (key,)) for key in keys}
    try:
        pool.wait_ready()
        outcomes = {outcome.key: outcome for outcome in pool.run("solve", list(items.values()))}
    finally:
        pool.shutdown()
    return pool, items, outcomes


def test_a_replica_death_charges_no_innocent_problem_and_a_killer_fails_on_two_replicas(cluster):
    pool, items, outcomes = _serve(["crash", "a", "b", "raise", "c", "d"], per_replica=2)
    assert sorted(outcomes) == sorted(items)  # every problem comes back, once
    for key in "abcd":
        assert outcomes[key].value == key.upper() and outcomes[key].error is None
        assert items[key].failed_on == []  # re-queued after deaths, never charged
    assert any(items[key].suspect for key in "abcd")  # some shared the crashing replica
    assert outcomes["crash"].error.startswith("failed on replicas 0 and 1: replica ")
    assert "died" in outcomes["crash"].error and sorted(items["crash"].failed_on) == [0, 1]
    # Raised twice: on both replicas, or twice on the one the crashes left alive.
    assert outcomes["raise"].error.endswith(": ValueError: bad problem raise")
    assert len(items["raise"].failed_on) == 2
    assert len(set(items["raise"].failed_on)) == 2 or pool.lost == 1
    assert pool.restarts + pool.lost >= 2


def test_a_hung_replica_is_found_by_its_heartbeat_killed_and_replaced(cluster):
    started = time.monotonic()
    pool, items, outcomes = _serve(["hang", "a", "b", "c"], per_replica=1, hang_timeout_s=3.0)
    assert time.monotonic() - started < 90  # bounded: no ray.wait without a timeout
    for key in "abc":
        assert outcomes[key].value == key.upper() and items[key].failed_on == []
    error = outcomes["hang"].error
    assert error.startswith("failed on replicas 0 and 1: replica ") and "hung (no heartbeat answered in 3 s)" in error
    # Hung once among others (not charged), then alone on each replica: three replaced.
    assert pool.replaced == 3 and pool.lost == 0
    assert all(replica.state == "ready" for replica in pool.replicas)
