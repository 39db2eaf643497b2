"""Answer extraction: what `extract_answer` reads from completions small models write.

The order is search-and-learn's math parser's: the last \\boxed{}, then the text after the
last "answer is", then the last number; None only when there is no candidate at all."""

from __future__ import annotations

import pytest

from search.answers import extract_answer, extract_boxed, normalize_answer

# (completion, expected extraction)
EXTRACTION_CASES = [
    # boxed, in every way models write it
    (r"Therefore, the final answer is: $\boxed{5}$. I hope it is correct.", "5"),
    (r"So $x = \boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
    (r"The answer is $\boxed{\dfrac{3}{4}}$", r"\frac{3}{4}"),
    (r"first \boxed{1}, then corrected: \boxed{2}", "2"),
    (r"$\boxed 7$", "7"),
    (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"(3,\frac{\pi}{2})"),
    (r"\boxed{90^\circ}", "90"),
    (r"\boxed{10\%}", "10"),
    (r"\boxed{\$18.90}", "18.90"),
    (r"\boxed{12\text{ cm}^2}", "12"),
    (r"\boxed{\text{Evelyn}}", "Evelyn"),
    (r"\boxed{x = 4}", "4"),
    (r"\boxed{2\sqrt{3}}", r"2\sqrt{3}"),
    (r"\boxed{\frac12}", r"\frac{1}{2}"),
    (r"\boxed{[-2, 7)}", "[-2,7)"),
    (r"\boxed{5.0}", "5"),
    (r"\fbox{8} is the result", "8"),
    (r"Since 3 + 4 = 7, \boxed{7} and then the model keeps talking about 12 apples.", "7"),
    (r"\boxed{\begin{bmatrix} 1 \\ 2 \end{bmatrix}}", r"\begin{pmatrix}1\\2\end{pmatrix}"),
    (r"\boxed{}. The answer is 6.", "6"),
    # "the answer is" without a box
    ("The final answer is 42.", "42"),
    ("The answer is: 3.5", "3.5"),
    ("Therefore, the final answer is $\\frac{7}{2}$. I hope it is correct.", r"\frac{7}{2}"),
    ("So the answer is 3/4.\n\nLet me double check: 3/4 is right.", r"\frac{3}{4}"),
    ("The answer is $-2$", "-2"),
    ("The answer is 12 cm.", "12"),
    ("The answer is 25 dollars. That is the total.", "25"),
    ("The answer is x = 9", "9"),
    ("The answer is five.", "5"),
    ("the answer is \\text{(C)}", "(C)"),
    ("The answer is $\\sqrt{2}$ and nothing else", r"\sqrt{2}"),
    ("The answer is 1,000.", "1,000"),
    ("The answer is no solution", "no solution"),
    # the last number
    ("We add 3 and 4 to get 7.", "7"),
    ("The total is 1,250 dollars", "1250"),
    ("x = -3", "-3"),
    ("The ratio is 0.75 after simplifying", "0.75"),
    ("Half of 9 is 4.5, and half again is 2.25", "2.25"),
    ("Step 1: 2 + 2 = 4\n\nStep 2: 4 * 3 = 12\n\n", "12"),
    ("It takes .5 hours", "0.5"),
    ("The probability is 3/8", "8"),
    # no candidate at all
    ("I am not sure how to solve this problem.", None),
    ("", None),
    ("\\boxed{}", None),
    ("The answer is", None),
]


@pytest.mark.parametrize(("completion", "expected"), EXTRACTION_CASES)
def test_extract_answer_table(completion: str, expected: str | None) -> None:
    assert extract_answer(completion) == expected


def test_the_table_is_large_and_varied() -> None:
    assert len(EXTRACTION_CASES) >= 40
    assert sum(answer is None for _, answer in EXTRACTION_CASES) >= 3


def test_extract_boxed() -> None:
    assert extract_boxed(r"so $\boxed{\frac{1}{2}}$") == r"\frac{1}{2}"
    assert extract_boxed(r"first \boxed{1}, then \boxed{a_{1}^{2}} done") == "a_{1}^{2}"
    assert extract_boxed(r"\boxed{\{1,\{2\}\}} and \fbox{7}.") == "7"
    assert extract_boxed(r"\fbox{7} then \boxed{\left\{ x \right.}") == r"\left\{ x \right."
    assert extract_boxed(r"The answer is $\boxed 5$.") == "5"
    assert extract_boxed(r"\boxed {12}") == "12"
    assert extract_boxed(r"\boxed{\frac{1}{2}") is None
    assert extract_boxed("no box here") is None


def test_normalize_answer_is_idempotent() -> None:
    answers = [expected for _, expected in EXTRACTION_CASES if expected is not None]
    assert [normalize_answer(answer) for answer in answers] == answers
