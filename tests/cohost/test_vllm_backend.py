"""The vLLM backend: the same tokens and PRM scores as the native engine, a CLI run on
vLLM, and one-line errors.

vLLM's CPU wheel lives in its own virtualenv (`make setup-vllm` builds .venv-vllm: its
transformers pin differs from ours), and `make test` runs this file there as well. In an
environment without vLLM the tests that need it skip and the "not installed" error is
checked instead; where vLLM is installed it is the other way round.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tts_runtime.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import SamplingParams

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed in this environment; "
                                "`make test` runs this file again in .venv-vllm, where it is")
SCORE_TOLERANCE = 2e-3  # fp32 both sides; vLLM's CPU kernels sum in another order than ours
KV_BYTES = 128 << 20  # each engine's KV cache: the workloads here hold a few thousand tokens
# Few sequences and a small token budget: vLLM sizes its sampler and activation buffers
# by them (Gemma's 262k-entry vocabulary makes each row 1 MiB), and the CI box is small.
SMALL = EngineConfig(cache=CacheConfig(kv_cache_bytes=KV_BYTES),
                     scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=512))


@pytest.fixture(scope="module")
def math_prompts(generator_model, math500_path) -> list[list[int]]:
    from tts_runtime.runs.datasets import DatasetConfig, load_problems
    from search.prompts import PromptBuilder

    builder = PromptBuilder(generator_model.tokenizer)
    problems = load_problems(DatasetConfig(dataset_path=str(math500_path), limit=3))
    return [builder.prompt_token_ids(p.question) for p in problems]


@pytest.fixture(scope="module")
def vllm_generator(generator_model):
    from tts_runtime.cohost.vllm_engine import VllmEngine

    engine = VllmEngine(generator_model.name, SMALL, loaded=generator_model, kv_cache_bytes=KV_BYTES)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def vllm_prm(prm_model):
    from tts_runtime.cohost.vllm_engine import VllmEngine

    engine = VllmEngine(prm_model.name, SMALL, loaded=prm_model, kv_cache_bytes=KV_BYTES)
    yield engine
    engine.shutdown()


@needs_vllm
def test_greedy_generation_equals_the_native_engine(generator_model, vllm_generator, math_prompts):
    params = SamplingParams(temperature=0, max_tokens=24)
    native = Engine(generator_model.name, SMALL, loaded=generator_model).generate(math_prompts, params)
    on_vllm = vllm_generator.generate(math_prompts, params)
    for ours, theirs in zip(native, on_vllm):
        assert theirs.completions[0].token_ids == ours.completions[0].token_ids
        assert theirs.completions[0].text == ours.completions[0].text
        assert theirs.completions[0].finish_reason == ours.completions[0].finish_reason == "length"


@needs_vllm
def test_stop_strings_n_and_finish_reasons(vllm_generator, math_prompts):
    out = vllm_generator.generate(math_prompts[:1], SamplingParams(
        temperature=0.8, n=3, seed=7, max_tokens=40, stop=("\n\n",), include_stop_str_in_output=True))[0]
    assert [c.index for c in out.completions] == [0, 1, 2]
    for completion in out.completions:
        assert completion.finish_reason in ("stop", "length", "eos")
        if completion.finish_reason == "stop":
            assert completion.text.endswith("\n\n") and completion.text.count("\n\n") == 1
    assert vllm_generator.stats.generated_tokens > 0


@needs_vllm
def test_seeded_prompts_longer_than_a_steps_token_budget(generator_model, math_prompts):
    """vLLM on CPU kills its engine when a seeded request's prefill is split over steps (a
    CPU torch.Generator has no offset to rewind); the backend prefills whole prompts there."""
    from tts_runtime.cohost.vllm_engine import VllmEngine

    budget = 64
    assert all(len(prompt) > budget for prompt in math_prompts)
    config = EngineConfig(cache=CacheConfig(kv_cache_bytes=KV_BYTES),
                          scheduler=SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=budget))
    engine = VllmEngine(generator_model.name, config, loaded=generator_model, kv_cache_bytes=KV_BYTES)
    try:
        params = [SamplingParams(temperature=0.8, seed=100 + i, max_tokens=8) for i in range(len(math_prompts))]
        first = [out.completions[0].token_ids for out in engine.generate(math_prompts, params)]
        again = [out.completions[0].token_ids for out in engine.generate(math_prompts, params)]
    finally:
        engine.shutdown()
    assert first == again and all(len(tokens) == 8 for tokens in first)

@needs_vllm
def test_prm_scores_equal_the_native_engine(prm_model, vllm_prm, math500_path):
    from tts_runtime.runs.datasets import DatasetConfig, load_problems
    from search.prm import make_prm_format

    question = load_problems(DatasetConfig(dataset_path=str(math500_path), limit=1))[0].question
    steps = ["Let me write the expression out.\n\n", "So the answer is $\\boxed{3}$.\n\n"]
    fmt = make_prm_format("judge", prm_model.tokenizer)
    queries = [fmt.build(question, steps[:k]) for k in (1, 2)]
    native = Engine(prm_model.name, SMALL, loaded=prm_model)
    params = [q.score_params() for q in queries]
    ours = native.score([q.token_ids for q in queries], params)
    cached_before = vllm_prm.stats.cached_prompt_tokens
    theirs = vllm_prm.score([q.token_ids for q in queries], params)
    for a, b in zip(ours, theirs):
        assert len(b.scores) == len(a.scores) == 1
        assert b.scores[0] == pytest.approx(a.scores[0], abs=SCORE_TOLERANCE)
    # Scoring the same queries again is served from vLLM's prefix cache.
    again = vllm_prm.score([q.token_ids for q in queries], params)
    assert [r.scores for r in again] == [r.scores for r in theirs]
    assert vllm_prm.stats.cached_prompt_tokens > cached_before


@needs_vllm
def test_score_at_an_inner_position(prm_model, vllm_prm):
    """A position before the last is scored over the prompt cut after it."""
    from tts_runtime.engine.request import ScoreParams

    ids = prm_model.tokenizer("Is two plus two four? Yes. Is it five? No.")["input_ids"]
    params = ScoreParams(positions=(5, len(ids) - 1), candidate_token_ids=(ids[6], ids[-1]))
    ours = Engine(prm_model.name, SMALL, loaded=prm_model).score([ids], params)[0]
    theirs = vllm_prm.score([ids], params)[0]
    assert len(theirs.scores) == len(ours.scores) == 2
    for mine, reference in zip(theirs.scores, ours.scores):
        assert mine == pytest.approx(reference, abs=SCORE_TOLERANCE)


@needs_vllm
@pytest.mark.slow
def test_cli_beam_on_vllm_writes_a_run_folder(tmp_path, math500_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "tts_runtime.cli", "beam", "--backend", "vllm", "--dataset-path",
               str(math500_path), "--device-memory", "3GiB", "--limit", "2", "--problem-batch", "2", "--n", "4",
               "--beam-width", "2", "--num-iterations", "2", "--max-step-tokens", "32", "--max-tokens", "48",
               "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["backend"] == "vllm"
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(row["beams"] for row in rows)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["problems"] == 2
    generator = metrics["memory"]["generator"]
    assert metrics["memory"]["backend"] == "vllm" and generator["lookup_unit"] == "tokens"
    assert generator["thrash_events"].startswith("unavailable")
    assert metrics["throughput"]["generator_tokens_per_s"] > 0


@needs_vllm
@pytest.mark.slow
def test_sweep_memory_on_vllm_sweeps_static_splits(tmp_path, math500_path):
    out = tmp_path / "sweep"
    command = [sys.executable, "-m", "tts_runtime.cli", "sweep-memory", "--backend", "vllm", "--splits", "0.3,0.6",
               "--dataset-path", str(math500_path), "--limit", "1", "--n", "2", "--beam-width", "2",
               "--num-iterations", "2", "--max-step-tokens", "8", "--device-memory", "2GiB",
               "--max-num-batched-tokens", "256", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads((out / "sweep.json").read_text())
    assert payload["backend"] == "vllm"
    rows = payload["rows"]
    assert [row["setting"] for row in rows] == ["static 0.30", "static 0.60", "auto"]  # no elastic on vLLM
    for row in rows:
        assert row["error"] == "" and row["problems"] == 1 and row["problems_per_s"] > 0
        assert row["generator_blocks"] > 0 and row["prm_blocks"] > 0
        assert row["generator_thrash"] is None and row["prm_thrash"] is None  # vLLM emits no block events
    # A larger PRM share gives the PRM's vLLM engine more blocks and the generator's fewer.
    assert rows[1]["prm_blocks"] > rows[0]["prm_blocks"] and rows[1]["generator_blocks"] < rows[0]["generator_blocks"]
    assert payload["settings"]["static 0.30"]["backend"] == "vllm"
    assert sorted(path.name for path in out.glob("*.png")) == ["hit_rate_vs_split.png", "throughput_vs_split.png"]


def test_unsupported_architecture_is_a_config_error():
    if not HAS_VLLM:
        pytest.skip("needs vLLM's model registry")
    from vllm import ModelRegistry

    from tts_runtime.cohost.vllm_engine import architecture

    assert architecture({"model_type": "gemma3_text"}) in ModelRegistry.get_supported_archs()
    with pytest.raises(ConfigError, match="cannot tell the architecture"):
        architecture({"model_type": "no-such-model"})


def _one_line_error(args: list[str], fragment: str, math500_path) -> None:
    from typer.testing import CliRunner

    from tts_runtime.cli import app

    result = CliRunner().invoke(app, args, env={"TTS_DATA_DIR": str(math500_path.parents[1])})
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], result.output


def test_bad_backend_and_elastic_policy_are_one_line_errors(math500_path):
    _one_line_error(["beam", "--limit", "1", "--backend", "tgi"], "unknown backend 'tgi'", math500_path)
    _one_line_error(["beam", "--limit", "1", "--backend", "vllm", "--memory-policy", "elastic"],
                    "cannot follow the elastic memory policy", math500_path)
    # The run configuration is checked before the sweep's own policy list: without vLLM its
    # absence is the first mistake named.
    _one_line_error(["sweep-memory", "--backend", "vllm", "--policies", "static,elastic"],
                    "cannot follow the elastic memory policy" if HAS_VLLM else "needs vLLM, which is not installed",
                    math500_path)
    _one_line_error(["sweep-memory", "--backend", "vllm", "--replicas", "2"], "Ray replicas", math500_path)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here; the error for a missing vLLM needs an "
                    "environment without it (the project's .venv)")
def test_missing_vllm_is_a_one_line_error(math500_path):
    _one_line_error(["beam", "--limit", "1", "--backend", "vllm"], "vLLM, which is not installed", math500_path)
    _one_line_error(["bench", "engine", "--backend", "vllm"], "vLLM, which is not installed", math500_path)


@needs_vllm
def test_dummy_models_are_refused():
    from tts_runtime.cohost.vllm_engine import VllmEngine

    with pytest.raises(ConfigError, match="real weights only"):
        VllmEngine("dummy:llama-3.2-1b", EngineConfig(device="cpu"))
