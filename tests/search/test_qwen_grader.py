"""The Qwen2.5-Math grader (`--grader qwen`) against pairs checked by hand with that
evaluation's rules, including pairs where math-verify (our default grader) disagrees."""

from __future__ import annotations

import threading
import time

import pytest

from search.grading import grade
from search.qwen_grader import _within, normalize, qwen_grade

# (prediction, reference): both graders say equal.
BOTH_EQUAL = [
    ("\\frac{1}{2}", "0.5"),                                 # symbolic: 1/2 == 0.5
    ("1/2", "\\frac12"),                                     # a/b and \frac12 both become \frac{1}{2}
    ("x=2", "2"),                                            # the `x=` prefix is dropped
    ("10,080", "10080"),                                     # commas dropped from numbers
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})"),  # \left, \right and spaces dropped
    ("\\frac{x+2}{7}", "\\frac{x}{7}+\\frac{2}{7}"),          # simplify(a - b) == 0
    ("90^\\circ", "90"),                                     # degrees dropped
    ("-\\frac{7}{4}", "-1.75"),
    ("\\$5", "5"),
]
# Both say different.
BOTH_DIFFERENT = [
    ("3", "4"),
    ("2.001", "2"),                                          # relative difference 5e-4 > 1e-4
    ("0.333", "\\frac13"),                                   # 1e-3 off
]
# Qwen's rules say equal, math-verify does not.
ONLY_QWEN = [
    ("1", "100"),                                            # reference / 100
    ("0.5", "50"),                                           # reference / 100
    ("2.0001", "2"),                                         # within a relative 1e-4
    ("0.3333", "\\frac13"),                                  # numerically within 1e-4
    ("3.1416", "\\pi"),                                      # N(pi) within 1e-4
    ("(1,2]", "[1,2)"),                                      # intervals compared item by item
    ("[1,2]", "(1,2)"),
    ("(3, 1.5708)", "\\left( 3, \\frac{\\pi}{2} \\right)"),  # tuple items numerically
    ("five", "5"),                                           # number words
    ("east", "teas"),                                        # both read as the product e*a*s*t
]
# math-verify says equal, Qwen's rules do not.
ONLY_MATH_VERIFY = [
    ("12", "12\\text{ inches}^2"),   # the unit word goes but `^2` stays: 12 against 144
    ("1,2,3", "3,2,1"),              # commas dropped: the numbers 123 and 321
    ("2x+4y=6", "x+2y=3"),           # `y=` is cut out of the middle: 2x+46 against x+23
    ("x \\in [1,2]", "[1,2]"),       # `x\in` is dropped only without the space
]


@pytest.mark.parametrize("prediction, reference", BOTH_EQUAL + ONLY_QWEN)
def test_qwen_equal(prediction: str, reference: str) -> None:
    assert qwen_grade(prediction, reference)
    assert grade(prediction, reference, "qwen")


@pytest.mark.parametrize("prediction, reference", BOTH_DIFFERENT + ONLY_MATH_VERIFY)
def test_qwen_different(prediction: str, reference: str) -> None:
    assert not qwen_grade(prediction, reference)


@pytest.mark.parametrize("prediction, reference", BOTH_EQUAL + ONLY_MATH_VERIFY)
def test_math_verify_equal(prediction: str, reference: str) -> None:
    assert grade(prediction, reference)


@pytest.mark.parametrize("prediction, reference", BOTH_DIFFERENT + ONLY_QWEN)
def test_math_verify_different(prediction: str, reference: str) -> None:
    assert not grade(prediction, reference)


def test_normalisation() -> None:
    assert normalize("\\dfrac12") == "\\frac{1}{2}"
    assert normalize("\\frac1{72}") == "\\frac{1}{72}"
    assert normalize("3/4") == "\\frac{3}{4}"
    assert normalize("k = 5.00") == "5"
    assert normalize("\\text{(C)}") == "(C)"
    assert normalize("\\begin{array}{cc}1&2\\end{array}") == "\\begin{pmatrix}1&2\\end{pmatrix}"
    assert normalize("50\\%") == "50"
    assert normalize(".5") == "0.5"
    assert normalize("2x+4y=6") == "2x+46"
    assert normalize("twenty one") == "21"


def test_no_answer_is_wrong() -> None:
    assert not qwen_grade(None, "2")
    assert not qwen_grade("", "2")


def test_a_comparison_that_runs_out_of_time_is_not_equal() -> None:
    started = time.perf_counter()
    assert _within(0.1, lambda: time.sleep(2) or True) is False
    assert time.perf_counter() - started < 1.5
    assert _within(0.1, lambda: True) is True


def test_grades_off_the_main_thread() -> None:
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.append(qwen_grade("\\frac{2}{4}", "0.5")))
    worker.start()
    worker.join(60)
    assert results == [True]
