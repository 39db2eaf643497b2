"""`tts sweep-memory` on a tiny configuration writes every file with the documented columns."""

from __future__ import annotations

import csv
import json
import re

import matplotlib.image
import pytest
from typer.testing import CliRunner

import evals.memory_sweep as sweep
from evals.memory_sweep import SWEEP_COLUMNS, phase_switching_seconds
from tts_runtime.cli import app

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def cli(generator_model, prm_model, monkeypatch):
    """The sweep command, reusing the session's loaded models."""
    models = {generator_model.name: generator_model, prm_model.name: prm_model}
    monkeypatch.setattr(sweep, "load_model", lambda name, dtype, device: models[name])
    return lambda args: CliRunner().invoke(app, ["sweep-memory", *args])


# The budgets are sized for weights without a packed copy: oneDNN on the plain weights, on any
# CPU (`auto` keeps a stream of fp32 weights beside them on CPUs with AVX2 and no AVX-512).
TINY = ["--limit", "1", "--n", "2", "--beam-width", "2", "--num-iterations", "2", "--max-step-tokens", "8",
        "--device-memory", "2GiB", "--max-num-batched-tokens", "128", "--linear-backend", "onednn"]


def _sweep(cli, math500_path, out, *args: str):
    """A tiny sweep that must succeed: (the CLI result, sweep.json)."""
    result = cli(["--dataset-path", str(math500_path), *TINY, *args, "--out", str(out)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result, json.loads((out / "sweep.json").read_text())


@pytest.mark.slow
def test_tiny_sweep_writes_table_json_plots_and_report(cli, math500_path, tmp_path):
    out, report = tmp_path / "sweep", tmp_path / "docs" / "memory.md"
    result = cli(["--splits", "0.3,0.6", "--policies", "static,auto,elastic", "--dataset-path", str(math500_path),
                  *TINY, "--out", str(out), "--markdown", str(report)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    with (out / "sweep.csv").open() as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert tuple(reader.fieldnames) == SWEEP_COLUMNS
    assert [r["setting"] for r in rows] == ["static 0.30", "static 0.60", "auto", "elastic"]
    for row in rows:
        assert row["error"] == ""
        assert int(row["problems"]) == 1 and float(row["problems_per_s"]) > 0
        assert int(row["peak_memory_bytes"]) > 1 << 30  # both models' weights are resident
        assert float(row["generator_blocks"]) > 0 and float(row["prm_blocks"]) > 0
    assert [float(r["prm_fraction"]) for r in rows[:2]] == [0.3, 0.6]
    payload = json.loads((out / "sweep.json").read_text())
    assert payload["columns"] == list(SWEEP_COLUMNS) and len(payload["rows"]) == 4
    assert payload["summary"]["best"] in {r["setting"] for r in rows}
    assert payload["summary"]["best_static"] in {"static 0.30", "static 0.60"}
    assert set(payload["summary"]) >= {"best_static", "auto_vs_best_static", "elastic_vs_best_static"}
    assert payload["settings"]["elastic"]["elastic"] is not None
    assert "reason" in payload["settings"]["auto"]["plan"]
    for name in ("throughput_vs_split", "blocks_over_steps", "hit_rate_vs_split", "thrash_vs_split"):
        png = out / f"{name}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC
        height, width, _ = matplotlib.image.imread(png).shape
        assert height > 200 and width > 300
        assert (report.parent / "memory" / f"{name}.png").is_file()
    text = report.read_text()
    assert "Best static split" in text and "static 0.60" in text and "](memory/throughput_vs_split.png)" in text
    assert "best:" in result.output and "problems/s" in result.output


@pytest.mark.slow
def test_shifting_workload_runs_both_phases_in_order_on_one_runtime(cli, math500_path, tmp_path):
    out = tmp_path / "sweep"
    # The report beside the sweep folder of its own name: its plots are already in place.
    _, payload = _sweep(cli, math500_path, out, "--splits", "0.3", "--policies", "static,elastic", "--limit", "2",
                        "--workload", "shifting", "--markdown", str(tmp_path / "sweep.md"))
    phases = payload["workload_phases"]
    assert [p["phase"] for p in phases] == ["generator-heavy", "prm-heavy"]
    assert [p["problems"] for p in phases] == [1, 1]
    # Generator-heavy: best-of-N with 4x the samples; PRM-heavy: beam search, twice the iterations, half steps.
    assert (phases[0]["search"]["method"], phases[0]["search"]["n"]) == ("bon", 8)
    assert phases[1]["search"]["method"] == "beam" and phases[1]["search"]["num_iterations"] == 4
    assert phases[1]["search"]["max_step_tokens"] == 4
    for row in payload["rows"]:
        assert row["error"] == "" and row["problems"] == 2
    for setting in ("static 0.30", "elastic"):
        marks = payload["settings"][setting]["phases"]
        assert [m["phase"] for m in marks] == ["generator-heavy", "prm-heavy"]
        assert marks[0]["first_step"] == 0 < marks[1]["first_step"] and all(m["seconds"] > 0 for m in marks)
        row = next(r for r in payload["rows"] if r["setting"] == setting)
        assert row["phase_seconds"] == [m["seconds"] for m in marks]  # one repeat: its own times
    # One static split is every phase's fastest: switching at the boundary gains nothing.
    assert payload["summary"]["phase_switching_gain"] == 1.0
    assert (out / "blocks_over_steps.png").read_bytes()[:8] == PNG_MAGIC
    report = (tmp_path / "sweep.md").read_text()
    assert "](sweep/blocks_over_steps.png)" in report
    assert "| setting | generator-heavy | prm-heavy | total |" in report


def test_phase_switching_takes_each_phases_fastest_static_split():
    """docs/benchmarks/memory_shifting.md's 2.0 GiB run: 0.2 is fastest in the generator-heavy
    phase, 0.6 in the PRM-heavy one; switching between them would take 100.4 s against the
    best single split's 106.4 (1.06x)."""
    rows = [{"phase_seconds": [40.9, 65.5]}, {"phase_seconds": [47.1, 62.1]}, {"phase_seconds": [55.7, 59.5]}]
    assert phase_switching_seconds(rows) == pytest.approx(100.4)
    assert phase_switching_seconds([{"phase_seconds": [97.0]}]) is None


@pytest.mark.parametrize("args, message", [
    (["--workload", "bursty"], "unknown --workload 'bursty'; choose one of steady, shifting"),
    (["--workload", "shifting"], "needs --limit 2 or more, got 1"),
    (["--splits", "0.2:1.4:0.4"], r"memory split must be in \(0, 1\)"),
    (["--policies", "static,magic"], "unknown memory policy 'magic'; choose one of static, auto, elastic"),
    (["--device-memory", "1GiB"], "the minimum is"),
])
def test_bad_sweep_input_is_a_clear_error(cli, math500_path, tmp_path, args, message):
    result = cli(["--dataset-path", str(math500_path), *TINY, "--out", str(tmp_path), *args])
    assert result.exit_code == 2, result.output  # a one-line error after the progress lines, no traceback
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: ") and re.search(message, line) and "Traceback" not in result.output, line


@pytest.mark.slow
def test_a_split_too_small_for_one_sequence_is_a_failed_row_run_once(cli, math500_path, tmp_path):
    # 1.9 GiB leaves ~40 MiB of KV; a PRM share of 0.99 leaves the generator no room for the prompt.
    result, payload = _sweep(cli, math500_path, tmp_path / "sweep", "--splits", "0.99", "--policies", "static",
                             "--device-memory", "1.9GiB", "--repeats", "3")
    assert result.output.count("FAILED: KV cache too small") == 1
    (row,) = payload["rows"]
    assert row["problems"] == 0 and row["problems_per_s"] == 0 and "raise the KV memory budget" in row["error"]
