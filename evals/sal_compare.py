"""Where two beam-search results disagree, problem by problem: search-and-learn's own run
and ours (evals/sal_diff.py), both in S&L's terms (`completions`, per-step `scores`, `pred`).

Texts and predictions must be equal; step scores equal within a tolerance (the two sides
run the PRM on different kernels, so float rounding differs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from search.answers import extract_answer

SNIPPET = 40  # characters shown on each side of where two texts part
SHOWN = 6  # differences per problem in the markdown table (the JSON has all)


@dataclass(frozen=True)
class SideResult:
    """One problem's result on one side: S&L's `completions`, `scores` and `pred`."""

    id: str
    completions: list[str]
    scores: list[list[float]]
    pred: str

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> SideResult:
        """From a row of S&L's `{approach}_completions.jsonl` or of evals/sal_side.py's output."""
        return cls(row.get("unique_id", row.get("id")), list(row["completions"]),
                   [list(s) for s in row["scores"]], row["pred"])


@dataclass
class ProblemDiff:
    id: str
    differences: list[str] = field(default_factory=list)
    max_score_delta: float = 0.0  # over the step scores both sides have

    @property
    def agree(self) -> bool:
        return not self.differences


def first_difference(a: str, b: str) -> int:
    """Index of the first character where `a` and `b` differ (the shorter length if one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _parting(a: str, b: str) -> str:
    at = first_difference(a, b)
    start = max(0, at - SNIPPET // 2)
    return f"from character {at}: S&L {a[start:at + SNIPPET]!r} vs tts {b[start:at + SNIPPET]!r}"


def compare_problem(sal: SideResult, ours: SideResult, tolerance: float) -> ProblemDiff:
    diff = ProblemDiff(sal.id)
    if len(sal.completions) != len(ours.completions):
        diff.differences.append(f"completions: {len(sal.completions)} (S&L) vs {len(ours.completions)} (tts)")
    for i, (a, b) in enumerate(zip(sal.completions, ours.completions)):
        if a != b:
            diff.differences.append(f"completion {i}: text differs {_parting(a, b)}")
    for i, (a, b) in enumerate(zip(sal.scores, ours.scores)):
        if len(a) != len(b):
            diff.differences.append(f"completion {i}: {len(a)} step scores (S&L) vs {len(b)} (tts)")
        for step, (x, y) in enumerate(zip(a, b)):
            delta = abs(x - y)
            diff.max_score_delta = max(diff.max_score_delta, delta)
            if delta > tolerance:
                diff.differences.append(f"completion {i} step {step}: score {x:.6f} (S&L) vs {y:.6f} (tts)")
    if sal.pred != ours.pred:
        diff.differences.append(f"pred: text differs {_parting(sal.pred, ours.pred)}; answers "
                                f"{extract_answer(sal.pred)!r} (S&L) vs {extract_answer(ours.pred)!r} (tts)")
    return diff


def compare(sal: Sequence[SideResult], ours: Sequence[SideResult], tolerance: float) -> list[ProblemDiff]:
    """One diff per problem of S&L's run, in its order; a problem missing on our side says so."""
    by_id = {result.id: result for result in ours}
    diffs = []
    for result in sal:
        if result.id in by_id:
            diffs.append(compare_problem(result, by_id[result.id], tolerance))
        else:
            diffs.append(ProblemDiff(result.id, ["no result on the tts side"]))
    return diffs


def report_markdown(diffs: Sequence[ProblemDiff], tolerance: float, header: Sequence[str] = ()) -> str:
    agreeing = sum(diff.agree for diff in diffs)
    lines = [*header, f"{agreeing} of {len(diffs)} problems agree (texts and preds equal, step scores within "
             f"{tolerance:g}).", "", "| problem | agree | max abs score difference | differences |",
             "|---|---|---|---|"]
    for diff in diffs:
        shown = [text.replace("|", "\\|").replace("\n", "\\n") for text in diff.differences[:SHOWN]]
        if len(diff.differences) > SHOWN:
            shown.append(f"... {len(diff.differences) - SHOWN} more")
        found = "<br>".join(shown) or "-"
        lines.append(f"| {diff.id} | {'yes' if diff.agree else 'no'} | {diff.max_score_delta:.2e} | {found} |")
    return "\n".join(lines) + "\n"


def report_json(diffs: Sequence[ProblemDiff], tolerance: float) -> dict[str, Any]:
    return {"tolerance": tolerance, "agree": sum(diff.agree for diff in diffs), "problems": len(diffs),
            "per_problem": [{**asdict(diff), "agree": diff.agree} for diff in diffs]}
