"""The differential check's comparison (evals/sal_compare.py): the part of evals/sal_diff.py
that needs no search-and-learn checkout. Rows are as each side writes them: S&L's side
(evals/sal_side.py: `id`) and our `beam_search_completions.jsonl` (`unique_id`)."""

from __future__ import annotations

import pytest

from evals.sal_compare import SideResult, compare, first_difference, report_json, report_markdown
from evals.sal_diff import parse_args
from tts_runtime.config import ConfigError

STEP1 = "We add the numbers.\n\n"
DONE = "Therefore, the final answer is: $\\boxed{5}$."
OTHER = "Therefore, the final answer is: $\\boxed{6}$."


def _sal(completions, scores, pred):
    return SideResult.from_row({"id": "test/algebra/1.json", "completions": completions, "scores": scores,
                                "pred": pred})


def _ours(completions, scores, pred):
    return SideResult.from_row({"unique_id": "test/algebra/1.json", "completions": completions,
                                "scores": scores, "pred": pred, "agg_scores": [s[-1] for s in scores]})


def test_equal_results_agree_within_the_tolerance():
    sal = _sal([STEP1 + DONE] * 2, [[0.25, 0.75]] * 2, STEP1 + DONE)
    ours = _ours([STEP1 + DONE] * 2, [[0.25 + 3e-7, 0.75]] * 2, STEP1 + DONE)
    [diff] = compare([sal], [ours], 1e-4)
    assert diff.agree and diff.max_score_delta == pytest.approx(3e-7)
    [tight] = compare([sal], [ours], 1e-7)
    assert not tight.agree and tight.differences == [
        "completion 0 step 0: score 0.250000 (S&L) vs 0.250000 (tts)",
        "completion 1 step 0: score 0.250000 (S&L) vs 0.250000 (tts)"]


def test_texts_scores_and_preds_that_differ_are_each_listed():
    sal = _sal([STEP1 + DONE, STEP1 + OTHER], [[0.25, 0.75], [0.25, 0.5, 0.5]], STEP1 + DONE)
    ours = _ours([STEP1 + DONE, STEP1 + DONE], [[0.25, 0.5], [0.25, 0.5]], STEP1 + DONE[:-1])
    [diff] = compare([sal], [ours], 1e-4)
    at = len(STEP1) + DONE.index("5")
    assert first_difference(STEP1 + OTHER, STEP1 + DONE) == at
    assert diff.differences[0].startswith(f"completion 1: text differs from character {at}: S&L ")
    assert "completion 1: 3 step scores (S&L) vs 2 (tts)" in diff.differences
    assert "completion 0 step 1: score 0.750000 (S&L) vs 0.500000 (tts)" in diff.differences
    assert diff.differences[-1].startswith(f"pred: text differs from character {len(STEP1 + DONE) - 1}")
    assert diff.differences[-1].endswith("answers '5' (S&L) vs '5' (tts)")
    assert diff.max_score_delta == pytest.approx(0.25)


def test_a_problem_missing_on_our_side_and_the_reports():
    sal = [_sal([DONE], [[0.5]], DONE), SideResult("test/algebra/2.json", [DONE], [[0.5]], DONE)]
    diffs = compare(sal, [_ours([DONE], [[0.5]], DONE)], 1e-4)
    assert [d.agree for d in diffs] == [True, False]
    assert diffs[1].differences == ["no result on the tts side"]
    markdown = report_markdown(diffs, 1e-4, ["# title", ""])
    assert markdown.startswith("# title\n\n1 of 2 problems agree (texts and preds equal, step scores within 0.0001).")
    assert "| test/algebra/2.json | no | 0.00e+00 | no result on the tts side |" in markdown
    assert report_json(diffs, 1e-4)["agree"] == 1
    many = compare([_sal([DONE] * 8, [[0.5]] * 8, DONE)], [_ours([OTHER] * 8, [[0.5]] * 8, DONE)], 1e-4)
    assert len(many[0].differences) == 8
    assert report_markdown(many, 1e-4).count("completion ") == 6 and "... 2 more |" in report_markdown(many, 1e-4)
    assert len(report_json(many, 1e-4)["per_problem"][0]["differences"]) == 8


def test_options_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="--sal-repo is required"):
        parse_args([])
    with pytest.raises(ConfigError, match="holds no src/sal"):
        parse_args(["--sal-repo", str(tmp_path)])
    (tmp_path / "src" / "sal").mkdir(parents=True)
    with pytest.raises(ConfigError, match="--backend gpu: choose native or vllm"):
        parse_args(["--sal-repo", str(tmp_path), "--backend", "gpu"])
    config = parse_args(["--sal-repo", str(tmp_path), "--levels", "1,3", "--sal-exact", "--limit", "2"])
    assert (config.levels, config.sal_exact, config.limit, config.n) == ((1, 3), True, 2, 4)
