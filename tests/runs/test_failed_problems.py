"""A problem whose search raises (issue 12): the run goes on, results.jsonl holds a line
with its id and the one-line error, metrics.json counts it, and `--resume` searches it again.

The failure is a real one: a MATH-500 problem whose question is repeated until its prompt
no longer fits the generator's context, so its search cannot make a request."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from search.config import SearchConfig
from tts_runtime.runs.datasets import DatasetConfig, load_problems
from tts_runtime.runs.run import run_into_folder
from tts_runtime.runs.run_folder import METRICS_FILE, RESULTS_FILE, RunFolder

TINY = SearchConfig(method="beam", n=2, beam_width=2, num_iterations=1, max_step_tokens=16, max_tokens=48,
                    problem_batch=2, temperature=0.0)


def _lines(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / RESULTS_FILE).read_text().splitlines()]


def test_failed_problem_is_recorded_and_resume_retries_it(search_runtime, math500_path, tmp_path):
    good, other = load_problems(DatasetConfig(dataset_path=str(math500_path), levels=(1,), limit=2))
    too_long = replace(other, question=" ".join([other.question] * 400))  # far past the 8192-token context

    outcome = run_into_folder(search_runtime, [good, too_long], TINY, RunFolder.open(tmp_path, resume=False))
    lines = _lines(tmp_path)
    assert [line["id"] for line in lines if "error" not in line] == [good.id]
    [failure] = [line for line in lines if "error" in line]
    assert failure["id"] == other.id and failure["level"] == other.level
    # The exception's type and message on one line (the context-fit rule refuses the prompt).
    assert re.fullmatch(r"\w+Error: [^\n]+", failure["error"]), failure["error"]
    metrics = json.loads((tmp_path / METRICS_FILE).read_text())
    assert metrics["failed"] == {"count": 1, "problems": [failure]}
    assert [r.id for r in outcome.new] == [good.id] and [f.id for f in outcome.failed] == [other.id]

    # Resumed with the problem as it really is: only the failed one is searched again.
    folder = RunFolder.open(tmp_path, resume=True)
    assert [f.id for f in folder.failed_problems()] == [other.id]
    outcome = run_into_folder(search_runtime, [good, other], TINY, folder)
    assert [r.id for r in outcome.previous] == [good.id] and [r.id for r in outcome.new] == [other.id]
    assert not outcome.failed and folder.failed_problems() == []
    assert sorted(r.id for r in folder.finished_results()) == sorted([good.id, other.id])
    metrics = json.loads((tmp_path / METRICS_FILE).read_text())
    assert metrics["failed"]["count"] == 0 and metrics["problems"] == 2
