"""search-and-learn's outputs, built from our results: one row per problem as its
`{approach}_completions.jsonl` holds it, and accuracy at every k its score.py reports.

S&L stores each problem's final `completions` (full texts), their per-step `scores` and
`pred` (the completion with the highest score under the run's aggregation). Its score.py
then recomputes `agg_scores` as the *last* step's score, whatever the run aggregated with,
and for every power of two k up to n takes the first k completions and votes:
`pred_naive@k` (the answer of the highest `agg_scores`, the first of equal ones),
`pred_weighted@k` (the answer group with the largest sum of `agg_scores`) and `pred_maj@k`
(the most frequent answer group), each wrapped in `\\boxed{}`. The rows here follow that,
with two deliberate differences (docs/semantics.md): answers are grouped by our canonical
forms (math-verify) instead of S&L's sympy `simplify`, and completions without an answer
never win a vote (S&L groups their empty answers like any other).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from search.aggregate import aggregate
from search.grading import grade, majority_pick, naive_pick, weighted_pick
from search.problem import Problem
from search.results import ProblemResult

# The file names S&L's scripts write (`{approach}_completions.jsonl`).
APPROACHES = {"beam": "beam_search", "bon": "best_of_n", "dvts": "dvts"}
VOTES = ("naive", "weighted", "maj")


def completions_file(method: str) -> str:
    return f"{APPROACHES[method]}_completions.jsonl"


def subset_sizes(n: int) -> list[int]:
    """S&L's k: every power of two up to n (1, 2, 4, ... n)."""
    return [2 ** i for i in range(n) if 2 ** i <= n]


def _boxed(answer: str | None) -> str:
    return "\\boxed{" + (answer or "") + "}"


def sal_row(problem: Problem, result: ProblemResult, n: int) -> dict[str, Any]:
    """The problem's row of `{approach}_completions.jsonl`, with S&L's column names."""
    completions = [beam.text for beam in result.beams]
    scores = [list(beam.step_scores) for beam in result.beams]
    agg_scores = [aggregate(s, "last") if s else 0.0 for s in scores]
    best = max(range(len(result.beams)), key=lambda i: result.beams[i].score, default=None)
    answers = [beam.answer for beam in result.beams]
    row: dict[str, Any] = {
        "unique_id": problem.id, "problem": problem.question, "answer": problem.answer,
        "subject": problem.subject, "level": problem.level,
        "completions": completions, "scores": scores, "agg_scores": agg_scores,
        "pred": completions[best] if best is not None else "",
        "completion_tokens": [beam.tokens for beam in result.beams],
    }
    for k in subset_sizes(n):
        candidates = list(zip(answers[:k], agg_scores[:k]))
        row[f"preds@{k}"] = [answer or "" for answer in answers[:k]]
        row[f"pred_naive@{k}"] = _boxed(naive_pick(candidates))
        row[f"pred_weighted@{k}"] = _boxed(weighted_pick(candidates))
        row[f"pred_maj@{k}"] = _boxed(majority_pick(candidates))
    return row


def _unboxed(pred: str) -> str | None:
    inner = pred.removeprefix("\\boxed{").removesuffix("}")
    return inner or None


def accuracy_at_k(rows: Sequence[dict[str, Any]], n: int, grader: str = "math-verify") -> dict[str, float]:
    """Share of rows whose `pred_{vote}@k` grades correct against `answer` by `grader`, for
    every vote and k (what S&L's evaluation reports per column)."""
    if not rows:
        return {}
    return {f"{vote}@{k}": sum(grade(_unboxed(row[f"pred_{vote}@{k}"]), row["answer"], grader)
                               for row in rows) / len(rows)
            for vote in VOTES for k in subset_sizes(n)}
