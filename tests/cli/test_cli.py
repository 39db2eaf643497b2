"""The `tts` command line: one-line errors, run folders, resume after a kill, end to end.

The end-to-end and resume tests run the CLI as a real subprocess on real MATH-500
problems with tiny search settings; the error tests run in-process (they fail before any
model is loaded)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from search.aggregate import aggregate
from search.grading import majority_pick, weighted_pick
from search.results import BeamResult, ProblemResult
from tests.helpers import REPO_ROOT
from tts_runtime import cpu_features
from tts_runtime.cli import app
from tts_runtime.config import ConfigError, resolve_dtype
from tts_runtime.executor.device_memory import device_memory_info
from tts_runtime.runs.run_folder import RESULTS_FILE, RunFolder

# A CPU budget of all this machine's memory, used whole: within what the machine has, so only
# the check after loading (KV beyond what is free once the weights are in) can refuse it.
WHOLE_MACHINE = ["--device-memory", str(device_memory_info("cpu").total), "--memory-utilization", "1"]
TINY = ["--n", "4", "--beam-width", "2", "--num-iterations", "2", "--max-step-tokens", "32", "--max-tokens", "48"]


def _invoke(args: list[str], **env: str | None):
    return CliRunner().invoke(app, args, env=env)


def _one_line_error(result, fragment: str) -> None:
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert fragment in lines[0]
    assert "Traceback" not in result.output


# -- one-line errors -----------------------------------------------------------------

@pytest.mark.parametrize("args, fragment", [
    (["beam", "--dataset", "gsm9k"], "unknown dataset 'gsm9k'"),
    (["beam", "--prm-format", "shepherd"], "unknown PRM format 'shepherd'"),
    (["beam", "--n", "6", "--beam-width", "4"], "n (6) must be a multiple of the beam width (4)"),
    (["dvts", "--n", "0"], "n must be >= 1"),
    (["beam", "--problem-batch", "0"], "problem batch must be >= 1"),
    (["beam", "--aggregation", "median"], "unknown score aggregation 'median'"),
    (["beam", "--limit", "1", "--generator", "llama-9000"], "unknown model 'llama-9000'"),
    (["bon", "--limit", "1", "--prm", "/no/such/prm"], "unknown model '/no/such/prm'"),
    (["beam", "--limit", "1", "--generator", "dummy:llama-3.2-1b"],
     "--generator dummy:llama-3.2-1b: a search needs the model's tokenizer and dummy weights have none"),
    (["sweep-memory", "--limit", "1", "--prm", "dummy:llama-3.1-8b"], "--prm dummy:llama-3.1-8b: a search needs"),
    (["beam", "--levels", "one"], "--levels takes a comma-separated list"),
    (["beam", "--ids", ""], "--ids is empty"),
    # Found by click before the command runs: one line too, not typer's panel.
    (["beam", "--seed", "abc"], "Invalid value for '--seed'"),
    (["beam", "--memory-split", "abc"], "Invalid value for '--memory-split'"),
    (["beam", "--nope"], "No such option: --nope"),
    (["beam", "extra"], "unexpected extra argument"),
    (["bench", "startup", "--rounds", "x"], "see `tts bench startup --help`"),
    (["bench", "startup", "--rounds", "0"], "--rounds must be >= 1, got 0"),
    (["nope"], "No such command 'nope'; see `tts --help`"),
    (["bench", "engine", "--dtypes", "fp8", "--workload", "nope"], "unknown dtype 'fp8'"),
    (["bench", "cohost", "--variants", "alternate,nope"], "--variants takes a comma-separated list"),
    (["bench", "host", "--limits", "x"], "--limits takes a comma-separated list"),
    (["bench", "host", "--limits", "20,0"], "--limit must be >= 1, got 0"),
    (["bench", "host", "--problem-batches", "16,0"], "problem batch must be >= 1, got 0"),
    (["beam", "--config", str(REPO_ROOT / "recipes" / "Llama-3.2-1B-Instruct")],
     "is a folder; pass one of its files: beam_search.yaml, best_of_n.yaml, dvts.yaml"),
    (["bench", "search", "--rounds", "0"], "--rounds must be >= 1, got 0"),
    (["bench", "engine", "--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
    (["bench", "gpu", "--search-limit", "-1"], "--search-limit must be >= 0, got -1"),
    (["sweep-memory", "--repeats", "0"], "--repeats must be >= 1, got 0"),
    (["beam", "--levels", ","], "--levels is empty"),
    (["beam", "--device-memory", "lots"], "cannot read memory size 'lots'"),
    (["beam", "--device", "sim:/no/such/fit.json"], "the cost file '/no/such/fit.json' does not exist"),
    (["beam", "--device", "sim:/dev/null"], "the cost file '/dev/null' is not a file"),
    (["beam", "--limit", "1", "--resume"], "--resume needs --out"),
    (["beam", "--limit", "1", "--linear-backend", "mkl"], "unknown --linear-backend 'mkl'"),
    (["beam", "--limit", "1", "--dtype", "int8"], "unknown dtype 'int8'"),
    (["bench", "search", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["bench", "cohost", "--dtype", "int8"], "unknown dtype 'int8'"),
    (["bench", "cohost", "--linear-backend", "fast"], "unknown --linear-backend 'fast'"),
    # More KV than this machine has free: an error now, not the out-of-memory killer later.
    (["bench", "search", "--limit", "1", "--torch-kernels", "--device-memory", str(device_memory_info("cpu").total)],
     "this bench holds 2 runtimes of --device-memory"),
    # More than the machine has in all: refused before any model loads.
    (["beam", "--limit", "1", "--device", "cpu", "--device-memory", "100000GiB"],
     "--device-memory 100000.00 GiB is more than this machine has in all"),
    (["bench", "search", "--device-memory", "1e+15"], "is more than this machine has in all"),
])
def test_bad_input_is_one_line(args, fragment, math500_path):
    _one_line_error(_invoke(args, TTS_DATA_DIR=str(math500_path.parents[1])), fragment)


def test_a_cpu_budget_beyond_free_memory_is_one_line_after_loading(math500_path):
    """The KV size needs the models' profiles, so this one comes after the loading line."""
    result = _invoke(["beam", "--limit", "1", "--device", "cpu", *WHOLE_MACHINE],
                     TTS_DATA_DIR=str(math500_path.parents[1]))
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert lines[0].startswith("loading ") and len(lines) == 2
    assert lines[1].startswith("error: --device-memory ") and "gives the KV caches" in lines[1]
    assert "of memory free; pass --device-memory" in lines[1]


def test_resuming_a_run_with_another_methods_command_names_the_right_one(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"search": {"method": "beam", "n": 4}}))
    _one_line_error(_invoke(["bon", "--resume", "--out", str(run)]),
                    f"{run} holds a beam run, not a bon one: resume it with `tts beam --resume --out {run}`")
    # A power loss tore config.json: the history still says what the run is.
    (run / "config.json").write_text('{"search": {"meth')
    (run / "history.jsonl").write_text(json.dumps({"event": "start", "config": {"search": {"method": "beam"}}}) + "\n")
    _one_line_error(_invoke(["bon", "--resume", "--out", str(run)]), f"{run} holds a beam run, not a bon one")


def test_missing_math500_says_how_to_point_at_a_copy(tmp_path):
    result = _invoke(["beam"], TTS_DATA_DIR=str(tmp_path), HF_HUB_OFFLINE="1")
    _one_line_error(result, "MATH-500 not found")
    assert "TTS_DATA_DIR" in result.output and "--dataset-path" in result.output


def test_unwritable_output_folder(tmp_path, math500_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = _invoke(["beam", "--limit", "1", "--out", str(blocker / "run")],
                     TTS_DATA_DIR=str(math500_path.parents[1]))
    _one_line_error(result, "cannot write to output folder")


@pytest.mark.parametrize("args, usage", [([], "Usage: tts [OPTIONS] COMMAND"),
                                          (["bench"], "Usage: tts bench [OPTIONS] COMMAND"),
                                          (["beam", "--help"], "Usage: tts beam [OPTIONS]")])
def test_help_still_prints_in_full(args, usage):
    """The root group's one-line errors leave help alone: a group without a command shows its
    help (exit 2, as click does), --help shows it and exits 0."""
    result = _invoke(args)
    assert result.exit_code == (0 if args[-1:] == ["--help"] else 2), result.output
    assert usage in result.output and "error:" not in result.output
    assert len(result.output.splitlines()) > 10


def test_every_command_help_is_whole_paragraphs():
    """A command's help is its docstring with each paragraph on one line: rich keeps line
    breaks, and the docstring's would break `tts bench --help`'s lines in mid-sentence."""
    import typer.main

    def commands(group, path):
        for name, cmd in group.commands.items():
            yield f"{path} {name}", cmd
            if hasattr(cmd, "commands"):
                yield from commands(cmd, f"{path} {name}")

    listed = list(commands(typer.main.get_command(app), "tts"))
    assert {"tts beam", "tts sweep-memory", "tts bench cohost", "tts models list"} <= {path for path, _ in listed}
    for path, cmd in listed:
        for paragraph in (cmd.help or "").split("\n\n"):
            assert "\n" not in paragraph, path
    # On a wide terminal a sentence that the docstring broke after "problems" is on one line.
    result = _invoke(["bench", "--help"], COLUMNS="200")
    assert result.exit_code == 0
    assert "first N MATH-500 problems (writes search.json" in result.output


def test_models_list_shows_every_alias():
    result = _invoke(["models", "list"])
    assert result.exit_code == 0, result.output
    for name in ("smollm2-135m-instruct", "gemma3-270m", "dummy:llama-3.2-1b", "dummy:llama-3.1-8b"):
        assert name in result.output
    assert "gemma3" in result.output and "1.24B" in result.output


# -- run folder ------------------------------------------------------------------------

def _result(problem_id: str) -> ProblemResult:
    beam = BeamResult(["x = 1\n\n", "$\\boxed{1}$"], [0.5, 0.9], 0.9, "1", "eos", 12)
    return ProblemResult(problem_id, 1, "Algebra", "1", "1", True, 0.9, "1", True, "1", True, [beam])


def test_run_folder_round_trips_results_and_cuts_a_torn_line(tmp_path):
    folder = RunFolder.open(tmp_path / "run", resume=False)
    folder.write_config({"method": "beam", "search": {"n": 4}})
    folder.append(_result("a"))
    folder.append(_result("b"))
    folder.release()
    with (tmp_path / "run" / RESULTS_FILE).open("a") as handle:
        handle.write('{"id": "c", "lev')  # killed mid-write
    resumed = RunFolder.open(tmp_path / "run", resume=True)
    assert resumed.finished_results() == [_result("a"), _result("b")]
    assert (tmp_path / "run" / RESULTS_FILE).read_text().endswith("}\n")


def test_run_folder_refuses_to_mix_runs(tmp_path):
    folder = RunFolder.open(tmp_path / "run", resume=False)
    folder.write_config({"method": "beam", "search": {"n": 4}})
    folder.append(_result("a"))
    folder.release()
    with pytest.raises(ConfigError, match="already holds a run"):
        RunFolder.open(tmp_path / "run", resume=False)
    with pytest.raises(ConfigError, match=r"its settings differ from this command.s \(search.n: 4 -> 8\)"):
        RunFolder.open(tmp_path / "run", resume=True).write_config({"method": "beam", "search": {"n": 8}})


# -- real runs ---------------------------------------------------------------------------

def test_a_run_refused_while_starting_leaves_no_folder_behind(tmp_path, math500_path):
    """The KV budget is checked once the models' sizes are known; the refused run's folder
    goes with it, so the corrected command starts anew rather than being told to --resume."""
    out = tmp_path / "run"
    result = _invoke(["beam", "--limit", "1", *WHOLE_MACHINE, "--out", str(out)],
                     TTS_DATA_DIR=str(math500_path.parents[1]))
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "gives the KV caches" in result.output.strip().splitlines()[-1]
    assert not out.exists()


def _tts(math500_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "tts_runtime.cli", "beam", "--dataset-path", str(math500_path),
            "--device-memory", "3GiB", *TINY, *args]


def _lines(folder: Path) -> list[dict]:
    path = folder / RESULTS_FILE
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()] if text.endswith("\n") else []


AUTO_DTYPE = str(resolve_dtype("auto", torch.device("cpu")))

# Three problems picked by id; sampling and both aggregations away from their defaults.
IDS = ["test/precalculus/807.json", "test/intermediate_algebra/1994.json", "test/algebra/1349.json"]
OPTIONS = ["--ids", ",".join(IDS), "--temperature", "0.6", "--top-p", "0.9", "--aggregation", "min",
           "--vote-aggregation", "prod", "--vote-ties", "best"]


@pytest.mark.slow
def test_cli_end_to_end_on_three_problems(tmp_path, math500_path):
    out = tmp_path / "run"
    done = subprocess.run(_tts(math500_path, *OPTIONS, "--problem-batch", "3", "--out", str(out)),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    # Not a terminal: one line per finished problem, then the summary with the run folder.
    progress = [line for line in done.stderr.splitlines() if line.startswith("[")]
    assert sorted(line.split("]")[0] for line in progress) == ["[1/3", "[2/3", "[3/3"]
    assert {line.split()[1] for line in progress} == set(IDS)
    for fragment in ("accuracy (weighted vote)", "problems/min", "generator tokens", "PRM tokens",
                     "prefix hit rate", "score-cache hit rate", "run folder"):
        assert fragment in done.stdout
    config = json.loads((out / "config.json").read_text())
    assert config["models"] == {"generator": "smollm2-135m-instruct", "prm": "gemma3-270m", "dtype": "auto",
                                "generator_revision": None, "prm_revision": None}
    assert (config["resolved"]["dtype"], config["resolved"]["prm_format"]) == (AUTO_DTYPE, "judge")
    assert config["search"]["n"] == 4 and config["search"]["beam_width"] == 2
    assert (config["search"]["temperature"], config["search"]["top_p"]) == (0.6, 0.9)
    assert (config["search"]["aggregation"], config["search"]["vote_aggregation"]) == ("min", "prod")
    assert sorted(config["dataset"]["ids"]) == sorted(IDS)
    assert set(config["versions"]) == {"python", "torch", "transformers", "tts"}
    assert config["machine"]["device"] == "cpu" and config["resolved"]["seed"] == 42
    rows = _lines(out)
    assert sorted(row["id"] for row in rows) == sorted(IDS)
    for row in rows:
        for key in ("id", "level", "prediction", "correct", "score", "beams", "generated_tokens", "prm_tokens",
                    "seconds"):
            assert key in row
        beams = row["beams"]
        assert beams and all(len(b["step_scores"]) == len(b["steps"]) for b in beams)
        # Beams ranked by the min of their step scores, votes weighted by the product.
        assert all(b["score"] == pytest.approx(aggregate(b["step_scores"], "min")) for b in beams)
        assert row["score"] == pytest.approx(max(b["score"] for b in beams))
        weights = [(b["answer"], aggregate(b["step_scores"], "prod")) for b in beams]
        assert row["weighted_prediction"] == weighted_pick(weights, "best")
        assert row["majority_prediction"] == majority_pick(weights, "best")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["problems"] == 3
    assert sum(level["problems"] for level in metrics["per_level"].values()) == 3
    speed = metrics["throughput"]
    assert speed["problems_per_s"] > 0 and speed["generator_tokens_per_s"] > 0 and speed["prm_tokens_per_s"] > 0
    # A problem's candidates share its question's blocks in the PRM; a beam that goes on
    # past its first step is continued from its cached prefix. (Whether any does, and
    # whether two candidates repeat a step for the score cache, depends on what is sampled.)
    rates, cache = speed["prefix_hit_rate"], speed["score_cache"]
    assert 0 < rates["prm"] < 1 and 0 <= rates["generator"] < 1
    if any(len(beam["steps"]) > 1 for row in rows for beam in row["beams"]):
        assert rates["generator"] > 0
    assert cache["misses"] > 0 and cache["hit_rate"] == pytest.approx(cache["hits"] / (cache["hits"] + cache["misses"]))
    assert metrics["memory"]["plan"]["budget_bytes"] == 3 << 30
    assert "accuracy (best beam)" in done.stdout


def test_auto_dtype_is_bf16_where_the_cpu_has_bf16_dot_products():
    want = torch.bfloat16 if cpu_features.has("avx512_bf16") else torch.float32
    assert resolve_dtype("auto", torch.device("cpu")) == want


@pytest.mark.slow
def test_dtype_option_overrides_auto_for_both_models(tmp_path, math500_path):
    other = "float32" if AUTO_DTYPE == "torch.bfloat16" else "bfloat16"
    out = tmp_path / "run"
    done = subprocess.run(_tts(math500_path, "--limit", "1", "--dtype", other, "--out", str(out)),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["models"]["dtype"] == other and config["resolved"]["dtype"] == f"torch.{other}"
    [row] = _lines(out)
    assert row["generated_tokens"] > 0 and row["beams"]


@pytest.mark.slow
def test_bench_search_runs_every_side_in_the_chosen_dtype(tmp_path, math500_path):
    command = [sys.executable, "-m", "tts_runtime.cli", "bench", "search", "--dataset-path", str(math500_path),
               "--limit", "1", "--n", "2", "--beam-width", "2", "--num-iterations", "1", "--max-step-tokens", "8",
               "--max-tokens", "16", "--rounds", "1", "--no-batch-one", "--torch-kernels", "--device-memory", "3GiB",
               "--dtype", "bfloat16", "--out-dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    data = json.loads((tmp_path / "search.json").read_text())
    assert data["models"]["dtype"] == "torch.bfloat16"
    assert set(data["median"]) == {"tts", "tts-torch-kernels", "baseline"}
    assert all(side["generator_tokens_per_s"] > 0 for side in data["median"].values())
    median = data["median"]
    assert set(data["ratio"]) == {"tts", "tts-torch-kernels"} and "ratio_to_sal_vllm" not in data
    assert data["ratio"]["tts"]["problems_per_min"] == pytest.approx(
        median["tts"]["problems_per_min"] / median["baseline"]["problems_per_min"])
    assert data["ratio_to_torch_kernels"]["prm_tokens_per_s"] == pytest.approx(
        median["tts"]["prm_tokens_per_s"] / median["tts-torch-kernels"]["prm_tokens_per_s"])
    assert "`gemma3-270m`, bfloat16." in (tmp_path / "search.md").read_text()


@pytest.mark.slow
def test_resume_after_the_run_is_killed(tmp_path, math500_path):
    out = tmp_path / "run"
    command = _tts(math500_path, "--limit", "2", "--problem-batch", "1", "--out", str(out))
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not _lines(out) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    landed = _lines(out)
    assert len(landed) == 1, "the run is killed after its first problem and before its second"
    finished_before = (out / RESULTS_FILE).read_text()

    # `--resume --out` alone continues with the options the run was started with.
    again = subprocess.run([sys.executable, "-m", "tts_runtime.cli", "beam", "--resume", "--out", str(out)],
                           capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = _lines(out)
    assert len(rows) == 2 and len({row["id"] for row in rows}) == 2
    assert (out / RESULTS_FILE).read_text().startswith(finished_before)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["problems"] == 2 and metrics["throughput"]["problems"] == 1

    # Once more: every problem is done and its metrics written, so no model loads.
    done = (out / RESULTS_FILE).read_text(), (out / "metrics.json").read_text()
    again = subprocess.run([sys.executable, "-m", "tts_runtime.cli", "beam", "--resume", "--out", str(out)],
                           capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{out} already holds all 2 problems; nothing to run" in again.stderr + again.stdout
    assert "loading" not in again.stderr + again.stdout
    assert ((out / RESULTS_FILE).read_text(), (out / "metrics.json").read_text()) == done


def test_cli_and_sweep_start_without_importing_ray():
    """Ray serves --replicas alone: a one-process run (a GPU box without Ray, say) must not
    need it, nor pay its second of import."""
    probe = "import sys, tts_runtime.cli, evals.memory_sweep; print(sorted(m for m in sys.modules if m.split('.')[0] == 'ray'))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
