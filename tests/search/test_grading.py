import json

import pytest

from search.answers import extract_boxed
from search.grading import canonical_answer, grade, majority_pick, naive_pick, vote, weighted_pick

from tests.helpers import shared_data_dir


MATH500 = shared_data_dir() / "math500" / "test.jsonl"
needs_math500 = pytest.mark.skipif(not MATH500.is_file(), reason=f"no MATH-500 copy at {MATH500}")

GRADE_CASES = [
    # units, degrees, money, percent
    ("864", r"864 \mbox{ inches}^2", True),
    ("15", r"15\mbox{ cm}^2", True),
    ("5.4", r"5.4 \text{ cents}", True),
    (r"\frac{270}{7}", r"\frac{270}7\text{ degrees}", True),
    ("90", r"90^\circ", True),
    (r"90^{\circ}", "90", True),
    ("10", r"10\%", True),
    (r"10\%", "10", True),
    ("32", r"\$32", True),
    ("18.90", r"\$18.90", True),
    ("32348", r"\$32,\!348", True),
    # thousands separators
    ("5000", r"5,\!000", True),
    ("5,000", "5000", True),
    ("11111111100", r"11,\! 111,\! 111,\! 100", True),
    # multiple choice and words
    ("C", r"\text{(C)}", True),
    ("(C)", r"\text{(C)}", True),
    ("Evelyn", r"\text{Evelyn}", True),
    # fractions and radicals
    ("14/3", r"\frac{14}{3}", True),
    (r"\dfrac{14}{3}", r"\frac{14}{3}", True),
    (r"\tfrac{1}{2}", r"\frac12", True),
    ("0.5", r"\frac12", True),
    (r"\frac{\sqrt2}{2}", r"\sqrt{2}/2", True),
    (r"2\sqrt{3}", r"\sqrt{12}", True),
    ("(x+1)^2", "x^2+2x+1", True),
    # intervals, tuples, sets
    ("[-2,7)", "[-2, 7)", True),
    (r"(-\infty,3]", r"(-\infty, 3]", True),
    (r"(2,12) \cup (12,102)", r"(2,12) \cup (12,102)", True),
    (r"\left(3,\frac{\pi}{2}\right)", r"(3, \frac{\pi}{2})", True),
    (r"\{2,1\}", r"\{1,2\}", True),
    (r"\boxed{5}", "5", True),
    # wrong answers
    (r"\frac{1}{3}", r"\frac{1}{2}", False),
    ("[-2,7]", "[-2,7)", False),
    ("90", r"80^\circ", False),
    ("B", r"\text{(C)}", False),
    ("864", r"865 \mbox{ inches}^2", False),
    (r"(3,\frac{\pi}{3})", r"(3, \frac{\pi}{2})", False),
    ("teas", r"\text{east}", False),
    ("5000", "500", False),
    ("12102", r"(2,12) \cup (12,102)", False),
    ("(2,12)", r"(2,12) \cup (12,102)", False),
    ("-3", "3", False),
    # junk never raises
    (None, "5", False),
    ("", "5", False),
    (r"\frac{", "5", False),
    ("}}}{{", r"\frac12", False),
    ("\\", "1", False),
]


@pytest.mark.parametrize(("prediction", "reference", "expected"), GRADE_CASES)
def test_grade_table(prediction: str | None, reference: str, expected: bool) -> None:
    assert grade(prediction, reference) is expected


def test_canonical_forms_collide() -> None:
    half = {canonical_answer(a) for a in (r"\frac12", r"\dfrac{1}{2}", "1/2", r"\tfrac{1}{2}")}
    assert len(half) == 1
    assert canonical_answer(r"\left( 3, \frac{\pi}{2} \right)") == canonical_answer(r"(3,\frac{\pi}{2})")
    assert canonical_answer(r"\text{(C)}") == canonical_answer("C")
    assert canonical_answer(r"90^\circ") == canonical_answer("90")
    assert canonical_answer(r"\text{east}") != canonical_answer("teas")
    assert canonical_answer(r"\frac13") != canonical_answer(r"\frac12")
    assert canonical_answer(None) is None
    assert canonical_answer("") is None


def test_voting() -> None:
    candidates = [
        (r"\frac12", 0.5),
        ("3", 0.95),
        (r"\dfrac{1}{2}", 0.6),
        ("0.5", 0.3),
        ("4", 0.9),
        ("4", 0.2),
    ]
    assert naive_pick(candidates) == "3"
    # 1/2 totals 1.4 against 1.1 for 4 and 0.95 for 3. search-and-learn names a group by its
    # first member; the "best" rule by its best-scored one.
    assert weighted_pick(candidates) == r"\frac12"
    assert weighted_pick(candidates, "best") == r"\dfrac{1}{2}"
    assert majority_pick(candidates) == r"\frac12"
    assert vote(candidates, "naive") == "3"
    assert vote(candidates, "weighted") == r"\frac12"
    assert vote(candidates, "maj", "best") == r"\dfrac{1}{2}"


def test_voting_ties_and_empty() -> None:
    tie = [("1", 0.4), ("2", 0.9), ("1", 0.3), ("2", 0.1)]
    assert majority_pick(tie) == "1"  # two each: search-and-learn takes the group seen first
    assert majority_pick(tie, "best") == "2"  # "2" holds the higher single score
    even = [("1", 0.5), ("2", 0.25), ("2", 0.25)]
    assert weighted_pick(even) == "1"
    assert weighted_pick(even, "best") == "1"
    assert weighted_pick(list(reversed(even))) == "2"
    assert naive_pick([("8", 0.5), ("9", 0.5)]) == "8"  # equal scores: the first candidate
    for method in ("naive", "weighted", "maj"):
        assert vote([], method) is None
    # Unanswered beams never outvote an answer (search-and-learn would count "" as one).
    assert majority_pick([(None, 0.9), (None, 0.8), ("7", 0.1)]) == "7"
    assert weighted_pick([(None, 0.9), (None, 0.8)]) is None
    with pytest.raises(ValueError, match="vote method"):
        vote(tie, "mean")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def math500_rows() -> list[dict]:
    with MATH500.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@needs_math500
def test_every_math500_answer_grades_itself(math500_rows: list[dict]) -> None:
    failures = [row["answer"] for row in math500_rows if not grade(row["answer"], row["answer"])]
    assert failures == []
    unparsed = [row["answer"] for row in math500_rows if canonical_answer(row["answer"]) is None]
    assert unparsed == []


@needs_math500
def test_math500_solution_boxes_match_answers(math500_rows: list[dict]) -> None:
    hits = sum(grade(extract_boxed(row["solution"]), row["answer"]) for row in math500_rows)
    assert hits / len(math500_rows) >= 0.97
