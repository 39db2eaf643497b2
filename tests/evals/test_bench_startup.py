"""`tts bench startup` at a tiny size: real `tts beam` processes, each variant's switch reaching
the KV cache (the lazy run holds far less memory), the same results, the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

@pytest.mark.slow
def test_bench_startup_runs_both_variants_as_real_commands(tmp_path, math500_path):
    command = [sys.executable, "-m", "tts_runtime.cli", "bench", "startup", "--dataset-path", str(math500_path),
               "--limit", "1", "--num-iterations", "1", "--max-step-tokens", "8", "--max-tokens", "16",
               "--device-memory", "5GiB",
               "--rounds", "1", "--stem", "startup_test"]
    # The report goes under docs/benchmarks/ of the working folder: here, the test's own.
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path, env=os.environ)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "docs" / "benchmarks" / "startup_test.json").read_text())
    assert [(row["round"], row["variant"]) for row in report["rows"]] == [(1, "eager"), (1, "lazy")]
    assert report["summary"]["same_results"] is True
    eager, lazy = (report["summary"]["medians"][label] for label in ("eager", "lazy"))
    # About 3 GiB of KV: eager writes all of it at start, lazy only the blocks one problem used.
    assert eager["peak_rss_gib"] - lazy["peak_rss_gib"] > 2
    assert all(row["search_s"] > 0 and row["outside_search_s"] > 0 for row in report["rows"])
    assert "Same results in every run (results.jsonl without timings): yes." in \
        (tmp_path / "docs" / "benchmarks" / "startup_test.md").read_text()

