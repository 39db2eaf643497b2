"""Pipeline parallelism with real stage processes, sockets and shared memory.

pp=2 must give the tokens and scores of pp=1 (the same kernels run the same layers, only
in two processes), through prefix-cache hits, forks, prefill chunks spread over
microbatches and preemption; SiPipe's switches must not change a token; failures must
surface as one line within 2 s and leave no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tts_runtime import CacheConfig, Engine, EngineConfig, SamplingParams, SchedulerConfig, ScoreParams
from tts_runtime.config import ConfigError, ParallelConfig
from tts_runtime.executor.batch import AttentionMetadata, ModelInput
from tts_runtime.executor.layer_costs import measure_stage_costs
from tts_runtime.executor.pipeline.pipeline import PipelineFailure
from tts_runtime.executor.pipeline.stage_placement import resolved_transport, stage_devices
from tts_runtime.executor.pipeline.stage_split import balanced_split, stage_layers
from tts_runtime.models.decoder import ModelPart
from tts_runtime.models.loader import load_model

from tests.helpers import REPO_ROOT

PREFIX = ("Solve the following math problem efficiently and clearly. Think step by step and put "
          "the final answer in a box. ")
QUESTIONS = ["What is 12 times 7?", "How many primes are below 20?", "Simplify 3/9.", "What is 2^10?"]


def _engine(model, pp: int, blocks: int = 256, chunk: int | None = 24, **parallel) -> Engine:
    config = EngineConfig(cache=CacheConfig(num_blocks=blocks),
                          scheduler=SchedulerConfig(max_prefill_chunk=chunk),
                          parallel=ParallelConfig(pp_size=pp, threads_per_stage=1, **parallel))
    return Engine(model.name, config, loaded=model)


def _generate(engine: Engine, params: list[SamplingParams]) -> list[list[list[int]]]:
    prompts = [engine.tokenize(PREFIX + q) for q in QUESTIONS]
    outputs = engine.generate(prompts, params)
    return [[c.token_ids for c in out.completions] for out in outputs]


GREEDY = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
          SamplingParams(temperature=0, max_tokens=12, n=2, ignore_eos=True),
          SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
          SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]
SEEDED = [SamplingParams(temperature=0.8, max_tokens=10, seed=s, n=1 + s % 2, ignore_eos=True) for s in range(4)]


@pytest.fixture(scope="module")
def pp1_greedy(generator_model):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # equal threads per stage
    try:
        return _generate(_engine(generator_model, 1), GREEDY)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pp2_seeded():
    """Seeded samples of the default pp=2 engine (driver sampling). Sampled tokens are
    compared pp=2 to pp=2: batches composed differently (pp=1) may differ in the last bits
    of a logit, which can move a sampled token; greedy tokens do not move."""
    return {}


def test_pp2_generates_the_greedy_tokens_of_pp1(generator_model, pp1_greedy, pp2_seeded):
    engine = _engine(generator_model, 2)
    try:
        assert _generate(engine, GREEDY) == pp1_greedy
        pp2_seeded["tokens"] = _generate(engine, SEEDED)
        snapshot = engine.snapshot()
        assert snapshot["prefix_hits"] > 0  # the shared instruction prefix
        assert max(engine.stats.in_flight_at_launch) == 2  # two microbatches really overlapped
        # Every prompt is longer than the 24-token chunk: its prefill spanned microbatches.
        assert min(len(engine.tokenize(PREFIX + q)) for q in QUESTIONS) > 24
    finally:
        engine.shutdown()


def test_sipipe_switches_off_change_no_token(generator_model, pp1_greedy, pp2_seeded):
    """The last stage samples (from plain-data rows: seeded draws are the driver's), inputs
    are prepared after each microbatch, activations travel as messages with their shape."""
    engine = _engine(generator_model, 2, sample_on_driver=False, token_safe=False, structure_aware=False)
    try:
        assert _generate(engine, GREEDY) == pp1_greedy
        assert _generate(engine, SEEDED) == pp2_seeded["tokens"]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("structure_aware", [True, False])
def test_gloo_transport_gives_the_tokens_of_shared_memory(generator_model, pp1_greedy, pp2_seeded, structure_aware):
    """Activations over torch.distributed point-to-point instead of shared-memory slots."""
    engine = _engine(generator_model, 2, transport="gloo", structure_aware=structure_aware)
    try:
        assert _generate(engine, GREEDY) == pp1_greedy
        assert _generate(engine, SEEDED) == pp2_seeded["tokens"]
    finally:
        engine.shutdown()


def test_stages_read_only_their_slice_of_the_checkpoint(generator_model):
    """A middle stage allocates and reads its layers only: no embedding, no head."""
    part = ModelPart(range(5, 10), embedding=False, head=False)
    sliced = load_model(generator_model.name, torch.float32, torch.device("cpu"), part).model
    whole = dict(generator_model.model.named_parameters())
    names = {name for name, _ in sliced.named_parameters()}
    assert names == {name for name in whole if name.startswith(tuple(f"layers.{i}." for i in range(5, 10)))
                     or name == "norm.weight"}
    assert all(torch.equal(whole[name], param) for name, param in sliced.named_parameters())


def test_pp2_matches_pp1_under_preemption(generator_model):
    """A pool of 10 blocks cannot hold four 40-token sequences: the scheduler preempts
    (never a sequence in flight) and recomputes; the tokens stay those of pp=1."""
    params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)] * 4
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expected = _generate(_engine(generator_model, 1, blocks=10), params)
    finally:
        torch.set_num_threads(threads)
    engine = _engine(generator_model, 2, blocks=10)
    try:
        assert _generate(engine, params) == expected
        assert engine.snapshot()["preemptions"] > 0
    finally:
        engine.shutdown()


def test_pp2_scores_equal_pp1(prm_model):
    prompts, positions = [], []
    for question in QUESTIONS:
        ids = [2] + list(range(300, 340)) + [400 + len(question) + i for i in range(9)]
        prompts.append(ids)
        positions.append(ScoreParams(positions=[20, len(ids) - 1], candidate_token_ids=[236792, 236787]))
    results = {}
    for pp in (1, 2):
        engine = _engine(prm_model, pp)
        try:
            results[pp] = [out.scores for out in engine.score(prompts, positions)]
            results[pp] += [out.scores for out in engine.score(prompts, positions)]  # prefix-cache hits
            assert engine.snapshot()["prefix_hits"] > 0
        finally:
            engine.shutdown()
    assert torch.allclose(torch.tensor(results[1]), torch.tensor(results[2]), atol=1e-6)


def test_token_safe_buffers_are_never_refilled_while_in_use(generator_model):
    """pp=3 keeps three microbatches in flight over two input-buffer versions: a stage may
    refill a version only after the microbatch that used it has finished computing."""
    engine = _engine(generator_model, 3)
    try:
        _generate(engine, GREEDY)
        assert max(engine.stats.in_flight_at_launch) == 3
        dumps = engine.executor.group.trace()
    finally:
        engine.shutdown()
    assert len(dumps) == 3
    for dump in dumps:
        prepared = {mb: (version, start) for what, mb, version, start, _ in dump.events if what == "prepare"}
        computed = {mb: end for what, mb, _, _, end in dump.events if what == "compute"}
        assert len(prepared) == len(computed) > 3
        for version in (0, 1):
            users = sorted(mb for mb, (v, _) in prepared.items() if v == version)
            for previous, following in zip(users, users[1:]):
                assert prepared[following][1] >= computed[previous], (dump.stage, previous, following)


def test_balanced_split_minimises_the_costliest_stage_with_the_head_on_the_last():
    # 30 equal layers and a head costing 8 of them: 19 | 11 + head = 19.
    assert balanced_split([1.0] * 30, 2, 8.0) == [19, 11]
    assert balanced_split([1.0] * 18, 2, 0.0) == [9, 9]
    assert balanced_split([5.0, 1.0, 1.0, 1.0], 2, 0.0) == [1, 3]  # unequal layers
    assert balanced_split([3.0, 1.0, 1.0, 1.0, 1.0, 1.0], 3, 1.0) == [1, 3, 2]  # 3 | 3 | 2 + head


def test_default_split_comes_from_measured_layer_and_head_times(generator_model):
    config = EngineConfig()
    sampled = measure_stage_costs(generator_model, config, samples_full_vocabulary=True, threads=1)
    assert len(sampled.layers) == generator_model.arch.num_layers and min(sampled.layers) > 0
    # A 49152 x 576 head over every probe row costs more than any one 576-wide layer...
    assert sampled.head > max(sampled.layers)
    split = stage_layers(generator_model.arch, 2, None, lambda: sampled)
    assert [len(r) for r in split] == balanced_split(sampled.layers, 2, sampled.head)
    assert len(split[0]) > len(split[1]) and split[0].stop == split[1].start
    # ...and projected onto two candidate columns (a PRM's score) far less.
    scored = measure_stage_costs(generator_model, config, samples_full_vocabulary=False, threads=1)
    assert scored.head < sampled.head / 5
    # One stage (an overlap worker) or --pp-layers: nothing is measured.
    assert stage_layers(generator_model.arch, 1, None, lambda: pytest.fail("measured")) == [range(0, 30)]
    assert stage_layers(generator_model.arch, 2, (10, 20), lambda: pytest.fail("measured")) == [
        range(0, 10), range(10, 30)]


def test_stages_take_a_gpu_each_where_they_can_and_nccl_only_then():
    cpu, gpu0, gpu1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)
    assert stage_devices(cpu, 2, 0) == [cpu, cpu]
    assert stage_devices(gpu0, 2, 2) == [gpu0, gpu1]
    assert stage_devices(gpu1, 3, 2) == [gpu1, gpu0, gpu1]  # more stages than GPUs: they share
    assert resolved_transport("auto", [cpu, cpu]) == "shm"
    assert resolved_transport("auto", [gpu0, gpu1]) == "nccl"
    assert resolved_transport("auto", [gpu0, gpu0]) == "shm"  # NCCL cannot pair ranks on one GPU
    assert resolved_transport("gloo", [gpu0, gpu1]) == "gloo"
    with pytest.raises(ConfigError, match="nccl needs every stage on a GPU of its own"):
        resolved_transport("nccl", [gpu0, gpu0])


def test_nccl_transport_on_cpu_stages_is_refused_before_any_stage_starts(generator_model):
    before = _children(os.getpid())
    with pytest.raises(ConfigError, match="use --pp-transport shm or gloo") as error:
        _engine(generator_model, 2, transport="nccl")
    assert "\n" not in str(error.value)
    assert _children(os.getpid()) == before


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_pp2_on_cuda_generates_the_greedy_tokens_of_pp1(cuda_graphs):
    """GPU stages (a GPU each when there are two, NCCL; else both on one GPU over shared
    memory), with per-parity decode graphs replaying the decode microbatches or eager."""
    model = load_model("smollm2-135m-instruct", torch.float32, torch.device("cuda"))

    def engine(pp: int) -> Engine:
        config = EngineConfig(device="cuda", cuda_graphs=cuda_graphs, cache=CacheConfig(num_blocks=256),
                              scheduler=SchedulerConfig(max_prefill_chunk=24),
                              parallel=ParallelConfig(pp_size=pp))
        return Engine(model.name, config, loaded=model)

    reference = engine(1)
    try:
        expected = _generate(reference, GREEDY)
    finally:
        reference.shutdown()
    pipelined = engine(2)
    try:
        assert all(d.type == "cuda" for d in pipelined.executor.group.devices)
        assert _generate(pipelined, GREEDY) == expected
    finally:
        pipelined.shutdown()


def _wait_gone(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(not _alive(pid) for pid in pids):
            return True
        time.sleep(0.05)
    return False


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or reaped between open and read
        return False
    return state != "Z"


def test_a_killed_stage_is_a_one_line_error_within_two_seconds(generator_model):
    engine = _engine(generator_model, 2)
    pids = [p.pid for p in engine.executor.group.processes]
    try:
        engine.add_request("long", engine.tokenize(PREFIX), SamplingParams(temperature=0, max_tokens=1000,
                                                                           ignore_eos=True))
        engine.step()
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(PipelineFailure) as failure:
            while True:
                engine.step()
        assert time.monotonic() - killed < 2.0
        assert str(failure.value) == f"pipeline stage 1 (pid {pids[1]}) killed by SIGKILL"
        assert _wait_gone(pids, 2.0)  # the other stage is stopped too: no orphan
    finally:
        engine.shutdown()


def _one_token_batch() -> ModelInput:
    """A one-token prefill into block 0."""
    return ModelInput(
        input_ids=torch.tensor([1]), positions=torch.tensor([0]),
        meta=AttentionMetadata(slot_mapping=torch.tensor([0]), num_decodes=0,
                               decode_block_tables=torch.zeros((0, 1), dtype=torch.int32),
                               decode_context_lens=torch.zeros(0, dtype=torch.int32),
                               prefill_query_starts=[0], prefill_query_lens=[1], prefill_context_lens=[1],
                               prefill_block_tables=torch.zeros((1, 1), dtype=torch.int32), block_size=16),
        sample_rows=torch.tensor([0]))


def test_an_exception_in_a_stage_arrives_with_its_traceback(generator_model):
    engine = _engine(generator_model, 2)
    group = engine.executor.group
    pids = [p.pid for p in group.processes]
    batch = _one_token_batch()
    try:
        future = group.launch("no-such-model", batch, None)
        with pytest.raises(PipelineFailure) as failure:
            future.result(timeout=30)
        text = str(failure.value)
        # Every stage gets the launch and raises; the first report names its stage.
        assert text.splitlines()[0] in {f"pipeline stage {stage} (pid {pid}) raised KeyError: 'no-such-model'"
                                        for stage, pid in enumerate(pids)}
        assert "Traceback (most recent call last)" in text and "stage_worker.py" in text
        assert _wait_gone(pids, 2.0)
    finally:
        engine.shutdown()


# -- the wire (executor/pipeline/wire.py) ------------------------------------------------------

def test_sockets_live_in_a_private_directory_and_the_start_up_wait_follows_the_model_size(generator_model):
    from tts_runtime.executor.pipeline.stage_messages import startup_seconds

    assert startup_seconds(0) == 120 and startup_seconds(70 << 30) == 120 + 60 * 70  # not a flat 600 s
    engine = _engine(generator_model, 2)
    group = engine.executor.group
    folder = group.socket_dir
    try:
        assert folder.stat().st_mode & 0o777 == 0o700 and folder.stat().st_uid == os.getuid()
        assert sorted(p.name for p in folder.iterdir()) == ["control-0", "control-1", "link-0", "results"]
        assert all(p.is_socket() for p in folder.iterdir())  # Unix-domain sockets: no TCP port open
        weights = sum(p.numel() * p.element_size() for p in generator_model.model.parameters())
        assert group.startup_seconds == pytest.approx(startup_seconds(weights))
        out = engine.generate([engine.tokenize("Hi")], [SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)])
        assert len(out[0].completions[0].token_ids) == 2  # runs over them
    finally:
        engine.shutdown()
    assert not folder.exists()


def test_a_stage_killed_just_before_a_send_is_a_one_line_error_not_a_hang(generator_model):
    """The launch goes out before the 100 ms watcher has seen the death: a PUSH socket whose
    peer is gone has nowhere to send, and a blocking send would wait for ever."""
    engine = _engine(generator_model, 2)
    group = engine.executor.group
    pids = [p.pid for p in group.processes]
    try:
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(PipelineFailure) as failure:
            for _ in range(50):  # the first sends may still fit in the socket's buffer
                group.launch(engine.executor.key, _one_token_batch(), None)
                time.sleep(0.005)
        assert time.monotonic() - killed < 2.0
        assert str(failure.value) == f"pipeline stage 1 (pid {pids[1]}) killed by SIGKILL"
        assert _wait_gone(pids, 2.0)
    finally:
        engine.shutdown()


class _RunsCode:
    """Unpickling this makes a folder: what a pickle from any local user could do to the driver."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def test_a_message_outside_the_schema_is_refused_unread(generator_model, tmp_path):
    import pickle

    import zmq

    engine = _engine(generator_model, 2)
    group = engine.executor.group
    pids = [p.pid for p in group.processes]
    marker = tmp_path / "pickle-ran"
    context = zmq.Context()
    intruder = context.socket(zmq.PUSH)
    try:
        intruder.connect(f"ipc://{group.socket_dir / 'results'}")
        intruder.send(pickle.dumps(_RunsCode(str(marker))))
        deadline = time.monotonic() + 5
        while group._failure is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(PipelineFailure) as failure:
            group.check()
        assert str(failure.value).startswith("pipeline refused a message that is not in the pipeline's schema: ")
        assert "\n" not in str(failure.value)
        assert not marker.exists()
        assert _wait_gone(pids, 2.0)
    finally:
        intruder.close(linger=0)
        context.term()
        engine.shutdown()


def test_the_wire_carries_every_message_and_refuses_anything_else():
    import msgpack

    from tts_runtime.executor.batch import ModelOutput, SamplePlan
    from tts_runtime.executor.pipeline import wire
    from tts_runtime.executor.pipeline.stage_messages import (Activation, Launch, Ready, StageFailure, StageResult,
                                                              TraceDump)
    from tts_runtime.executor.sampler import SamplingRow

    plan = SamplePlan([0], [SamplingRow(SamplingParams(temperature=0.7, repetition_penalty=1.1), [1, 2, 3, 4], 2, 7, 3)])
    launch = wire.decode(wire.encode(Launch(3, "generator", _one_token_batch(), plan)))
    assert launch.microbatch == 3 and launch.model == "generator"
    assert torch.equal(launch.batch.meta.prefill_block_tables, _one_token_batch().meta.prefill_block_tables)
    assert launch.batch.block_copies is None
    copies = torch.tensor([[4, 9], [5, 10]])  # a forked child's copies of partial blocks
    copying = wire.decode(wire.encode(Launch(4, "generator", replace(_one_token_batch(), block_copies=copies), plan)))
    assert torch.equal(copying.batch.block_copies, copies)
    row = launch.sample_plan.rows[0]
    assert (row.token_ids, row.num_tokens, row.seed, row.params.temperature, row.params.greedy,
            row.params.uses_penalties) == ([1, 2, 3], 3, 7, 0.7, False, True)
    logits = torch.randn(2, 5).to(torch.bfloat16)
    result = wire.decode(wire.encode(StageResult(1, ModelOutput(logits, [torch.randn(3, 2)], [4, 5]))))
    assert torch.equal(result.output.sample_logits, logits) and result.output.sampled_tokens == [4, 5]
    assert torch.equal(wire.decode(wire.encode(Activation(2, logits))).hidden, logits)
    for message in (Ready(1, 99), TraceDump(0, [("compute", 1, 0, 0.5, 0.75)]), StageFailure(1, 2, "Traceback")):
        assert wire.decode(wire.encode(message)) == message
    header = msgpack.unpackb(wire.encode(Ready(1, 99))[0])
    frames = wire.encode(StageResult(1, ModelOutput(logits, [], None)))
    refused = [
        [b"\x80\x04K\x01."],  # a pickle
        [msgpack.packb({"kind": "exec", "code": "import os"})],  # a kind the schema does not have
        [msgpack.packb({**header, "extra": 1})],  # a field too many
        [msgpack.packb({**header, "pid": "99"})],  # a field of the wrong type
        [msgpack.packb({**header, "pid": True})],
        [frames[0], bytes(frames[1])[:-1]],  # a tensor shorter than its shape
        [frames[0]],  # a tensor frame missing
        [msgpack.packb({**msgpack.unpackb(frames[0]), "sample_logits": {"frame": 1, "dtype": "object",
                                                                       "shape": [2, 5]}}), frames[1]],
    ]
    for message in refused:
        with pytest.raises(wire.WireError):
            wire.decode(message)


def test_stages_exit_when_the_driver_dies(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent("""
        import os, signal, sys
        from tts_runtime import CacheConfig, Engine, EngineConfig
        from tts_runtime.config import ConfigError, ParallelConfig

        if __name__ == "__main__":
            engine = Engine("smollm2-135m-instruct", EngineConfig(
                cache=CacheConfig(num_blocks=64), parallel=ParallelConfig(pp_size=2, threads_per_stage=1)))
            print(" ".join(str(p.pid) for p in engine.executor.group.processes), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                          cwd=REPO_ROOT)
    assert done.returncode == -signal.SIGKILL, done.stderr
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 2
    assert _wait_gone(pids, 2.0)


# -- the CLI ---------------------------------------------------------------------------------

TINY = ["--n", "2", "--beam-width", "2", "--num-iterations", "2", "--max-step-tokens", "24", "--max-tokens", "48",
        "--temperature", "0", "--device-memory", "3GiB", "--problem-batch", "1"]


def _tts(math500_path: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "tts_runtime.cli", "beam", "--dataset-path", str(math500_path),
            *TINY, "--out", str(out), *extra]


def _results(folder: Path) -> dict[str, dict]:
    lines = (folder / "results.jsonl").read_text().splitlines()
    return {row["id"]: row for row in map(json.loads, lines)}


def test_cli_beam_pp2_writes_the_predictions_and_beams_of_pp1(math500_path, tmp_path):
    # fp32: PP2 splits the decodes over microbatches, and in bf16 the projections' kernel and
    # so the rounding change with the rows a forward holds.
    rows = {}
    for pp in ("1", "2"):
        done = subprocess.run(_tts(math500_path, tmp_path / pp, "--limit", "2", "--pp", pp, "--dtype", "float32"),
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-2000:]
        rows[pp] = _results(tmp_path / pp)
    assert rows["1"].keys() == rows["2"].keys() and len(rows["1"]) == 2
    for problem, row in rows["1"].items():
        other = rows["2"][problem]
        assert other["prediction"] == row["prediction"]
        assert [b["steps"] for b in other["beams"]] == [b["steps"] for b in row["beams"]]


def test_bench_search_runs_tts_on_pipeline_stages(math500_path, tmp_path):
    command = [sys.executable, "-m", "tts_runtime.cli", "bench", "search", "--dataset-path", str(math500_path),
               "--limit", "1", "--n", "2", "--beam-width", "2", "--num-iterations", "1", "--max-step-tokens", "8",
               "--max-tokens", "16", "--rounds", "1", "--no-baseline", "--no-batch-one", "--device-memory", "3GiB",
               "--pp", "2", "--pp-layers", "16,14", "--out-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "search.json").read_text())
    assert data["pipeline"]["layers_per_stage"]["generator"] == [16, 14]
    assert sum(data["pipeline"]["layers_per_stage"]["prm"]) == 18  # Gemma-3-270M, balanced on measured time
    assert data["median"]["tts"]["generator_tokens_per_s"] > 0
    assert "tts ran on 2 pipeline stages (layers per stage: generator 16+14" in (tmp_path / "search.md").read_text()


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def test_cli_stage_killed_mid_run_is_one_line_and_resumes(math500_path, tmp_path):
    command = _tts(math500_path, tmp_path / "run", "--limit", "2", "--pp", "2")
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = tmp_path / "run" / "results.jsonl"
    deadline = time.monotonic() + 900
    while not (results.exists() and results.read_text().strip()) and time.monotonic() < deadline:
        assert run.poll() is None, run.stderr.read()[-2000:]
        time.sleep(0.2)
    stages = [pid for pid in _children(run.pid) if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
    assert stages, "no stage process found"
    os.kill(stages[-1], signal.SIGKILL)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 1
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "killed by SIGKILL" in errors[0], stderr[-2000:]
    assert "Traceback" not in stderr
    assert len(_results(tmp_path / "run")) == 1
    again = subprocess.run(command + ["--resume"], capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    lines = results.read_text().splitlines()
    assert len(lines) == 2 and len({json.loads(line)["id"] for line in lines}) == 2
