"""search-and-learn's outputs: `{approach}_completions.jsonl` rows and accuracy at every k,
checked against values worked out by hand, then written by a real run."""

from __future__ import annotations

import json

from tts_runtime.runs.datasets import DatasetConfig, load_problems
from tts_runtime.runs.run_folder import METRICS_FILE, RunFolder
from tts_runtime.runs.run import run_into_folder
from search.config import SearchConfig
from search.problem import Problem
from search.results import BeamResult, ProblemResult
from search.sal_outputs import accuracy_at_k, completions_file, sal_row, subset_sizes

PROBLEM = Problem(id="p", question="What is 6/3?", answer="2", level=1, subject="Arithmetic")


def _beam(answer: str | None, step_scores: list[float], score: float) -> BeamResult:
    text = f"so \\boxed{{{answer}}}" if answer else "no answer"
    return BeamResult([text], step_scores, score, answer, "eos", 5)


# Eight completions in search order. `score` is the run's aggregation (say min); S&L's
# agg_scores are the last step scores.
BEAMS = [
    _beam("3", [0.9, 0.2], 0.2),    # 0: last 0.2
    _beam("2", [0.1, 0.5], 0.1),    # 1: last 0.5
    _beam("2", [0.3, 0.4], 0.3),    # 2: last 0.4
    _beam(None, [0.99], 0.99),      # 3: no answer, last 0.99, best by the run's aggregation
    _beam("4", [0.7, 0.7], 0.7),    # 4: last 0.7
    _beam("4", [0.6], 0.6),         # 5: last 0.6
    _beam("4", [0.1], 0.1),         # 6: last 0.1
    _beam("3", [0.95], 0.95),       # 7: last 0.95
]


def _result() -> ProblemResult:
    return ProblemResult("p", 1, "Arithmetic", "2", None, False, 0.99, None, False, None, False, BEAMS)


def test_subset_sizes_are_the_powers_of_two_up_to_n():
    assert subset_sizes(1) == [1]
    assert subset_sizes(4) == [1, 2, 4]
    assert subset_sizes(6) == [1, 2, 4]
    assert subset_sizes(16) == [1, 2, 4, 8, 16]


def test_row_matches_hand_computed_votes_at_every_k():
    row = sal_row(PROBLEM, _result(), n=8)
    assert row["agg_scores"] == [0.2, 0.5, 0.4, 0.99, 0.7, 0.6, 0.1, 0.95]
    assert row["pred"] == "no answer"  # the best completion by the run's aggregation, as S&L's pred
    assert row["completions"][0] == "so \\boxed{3}" and row["scores"][1] == [0.1, 0.5]
    expected = {
        # k=1: only completion 0.
        1: ("3", "3", "3"),
        # k=2: 3 (0.2) vs 2 (0.5): naive 2, weighted 2 (0.5 > 0.2), majority tie -> first seen, 3.
        2: ("2", "2", "3"),
        # k=4: + 2 (0.4) + no answer (0.99, wins naive, cannot win a vote): weighted 2 (0.9),
        # majority 2 (two votes).
        4: ("", "2", "2"),
        # k=8: sums 3: 1.15, 2: 0.9, 4: 1.4; counts 3: 2, 2: 2, 4: 3. Naive: the no-answer one.
        8: ("", "4", "4"),
    }
    for k, (naive, weighted, majority) in expected.items():
        assert row[f"pred_naive@{k}"] == "\\boxed{" + naive + "}", k
        assert row[f"pred_weighted@{k}"] == "\\boxed{" + weighted + "}", k
        assert row[f"pred_maj@{k}"] == "\\boxed{" + majority + "}", k
    assert row["preds@4"] == ["3", "2", "2", ""]


def test_accuracy_at_k_grades_each_column():
    row = sal_row(PROBLEM, _result(), n=8)
    accuracy = accuracy_at_k([row, {**row, "answer": "4"}], n=8)
    assert accuracy["weighted@2"] == 0.5 and accuracy["maj@2"] == 0.0
    assert accuracy["weighted@8"] == 0.5 and accuracy["maj@8"] == 0.5 and accuracy["naive@8"] == 0.0
    assert accuracy["naive@1"] == 0.0 and set(accuracy) == {f"{v}@{k}" for v in ("naive", "weighted", "maj")
                                                            for k in (1, 2, 4, 8)}


def test_accuracy_at_k_with_the_qwen_grader():
    """Qwen's math_equal also accepts the reference / 100 and * 100: `2` is right for `200`."""
    row = {**sal_row(PROBLEM, _result(), n=8), "answer": "200"}
    by_qwen, by_math_verify = accuracy_at_k([row], n=8, grader="qwen"), accuracy_at_k([row], n=8)
    assert by_qwen["weighted@2"] == 1.0 and by_qwen["maj@2"] == 0.0 and by_qwen["weighted@8"] == 0.0
    assert by_math_verify["weighted@2"] == 0.0


def test_a_run_writes_the_completions_file_and_accuracy_at_k(search_runtime, math500_path, tmp_path):
    config = SearchConfig(method="beam", n=4, beam_width=2, num_iterations=1, max_step_tokens=16, max_tokens=32,
                          problem_batch=2, temperature=0.0)
    problems = load_problems(DatasetConfig(dataset_path=str(math500_path), levels=(1,), limit=2))
    with RunFolder.open(tmp_path / "run", resume=False) as folder:
        outcome = run_into_folder(search_runtime, problems, config, folder)
    rows = [json.loads(line) for line in (tmp_path / "run" / completions_file("beam")).read_text().splitlines()]
    assert [row["unique_id"] for row in rows] == [problem.id for problem in problems]
    assert rows[0]["problem"] == problems[0].question and rows[0]["answer"] == problems[0].answer
    result = {r.id: r for r in outcome.new}[problems[0].id]
    assert rows[0]["completions"] == [beam.text for beam in result.beams]
    assert rows[0]["scores"] == [beam.step_scores for beam in result.beams]
    assert {"pred_weighted@4", "pred_maj@4", "pred_naive@4", "pred_naive@1"} <= set(rows[0])
    metrics = json.loads((tmp_path / "run" / METRICS_FILE).read_text())
    assert set(metrics["accuracy_at_k"]) == {f"{v}@{k}" for v in ("naive", "weighted", "maj") for k in (1, 2, 4)}
    assert metrics["grader"] == "math-verify"
