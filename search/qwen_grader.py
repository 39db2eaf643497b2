"""Answer equivalence by the rules of Qwen2.5-Math's evaluation (`math_equal` after its
answer clean-up), which search-and-learn's published accuracies come from.

Written from a reading of that evaluation's behaviour, not from its code. Both answers are
first normalised the same way (LaTeX spelling, units, `x=` prefixes, fractions), then compared:

1. equal as text, ignoring case;
2. if both read as numbers (commas dropped, a trailing `%` divides by 100): the prediction
   equals the reference, the reference / 100 or the reference * 100 within a relative 1e-4,
   and nothing else is tried (so `1` matches `100` and `0.5` matches `50`);
3. brackets and braces dropped, equal as text (so a tuple matches a set of the same items);
4. `(a, b ...)` / `[a, b ...]` on both sides: item by item, whatever the bracket kinds
   (so the intervals `(1,2]` and `[1,2)` match); matrices cell by cell;
5. equations: `l = r` against `l' = r'` as `l - r = ±(l' - r')`; a short `x = v` against
   a bare value by `v`;
6. symbolically with sympy: same printed form, `simplify(a - b) == 0`, or numerically equal
   within a relative 1e-4 (so `3.1416` matches `\\pi`); matrices rounded to 3 places.

The whole comparison is bounded by a timeout (Qwen's evaluation gives each pair 3 s); a
comparison that runs out counts as not equal. Where only the main thread may set an alarm
(as in `search.grading`), other threads compare without one.
"""

from __future__ import annotations

import math
import re
import signal
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import sympy
from latex2sympy2_extended import latex2sympy
from sympy.parsing.sympy_parser import parse_expr

TIMEOUT_S = 3.0
_REL_TOL = 1e-4
_CHOICES = ("A", "B", "C", "D", "E")

# MathQA-style unit words the evaluation strips when they stand alone (bounded by
# non-word characters or the ends): the same list, for the same answers after clean-up.
_UNIT_WORDS = (
    "east", "degree", "mph", "kmph", "ft", "m sqaure", " m east", "sq m", "deg", "mile", "q .", "monkey",
    "prime", "ratio", "profit of rs", "rd", "o", "gm", "p . m", "lb", "tile", "per", "dm", "lt", "gain",
    "ab", "way", "west", "a .", "b .", "c .", "d .", "e .", "f .", "g .", "h .", "t", "a", "h", "no change",
    "men", "soldier", "pie", "bc", "excess", "st", "inches", "noon", "percent", "by", "gal", "kmh", "c",
    "acre", "rise", "a . m", "th", "π r 2", "sq", "mark", "l", "toy", "coin", "sq . m", "gallon", "° f",
    "profit", "minw", "yr", "women", "feet", "am", "pm", "hr", "cu cm", "square", "v â € ™", "are",
    "rupee", "rounds", "cubic", "cc", "mtr", "s", "ohm", "number", "kmph", "day", "hour", "minute", "min",
    "second", "man", "woman", "sec", "cube", "mt", "sq inch", "mp", "∏ cm ³", "hectare", "more", "sec",
    "unit", "cu . m", "cm 2", "rs .", "rs", "kg", "g", "month", "km", "m", "cm", "mm", "apple", "liter",
    "loss", "yard", "pure", "year", "increase", "decrease", "d", "less", "Surface", "litre", "pi sq m",
    "s .", "metre", "meter", "inch",
)
_UNIT_PATTERNS = tuple(re.compile(r"(^|\W)" + word + r"($|\W)") for word in _UNIT_WORDS + tuple(
    word + "s" for word in _UNIT_WORDS))
_SMALL_NUMBERS = {word: value for value, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen".split())}
_TENS = {word: 10 * (i + 2) for i, word in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10 ** 6, "billion": 10 ** 9}
_PREFIXES = ("x=", "y=", "z=", "x\\in", "y\\in", "z\\in", "x\\to", "y\\to", "z\\to")
_BRACKETED = re.compile(r"(\(|\[).+(\)|\])")
_MATRIX_OPEN = ("\\begin{pmatrix}", "\\begin{bmatrix}")
_MATRIX_CLOSE = ("\\end{pmatrix}", "\\end{bmatrix}")


class _OutOfTime(Exception):
    pass


# --- normalisation ----------------------------------------------------------------------

def normalize(answer: str) -> str:
    """The evaluation's clean-up of an answer, applied to prediction and reference alike."""
    text = answer.strip().replace("\n", "").rstrip(".").replace("\\!", "")
    text = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", text)
    text = re.sub(r"\\end\{array\}", r"\\end{pmatrix}", text).replace("bmatrix", "pmatrix")
    text = text.replace("tfrac", "frac").replace("dfrac", "frac")
    text = text.replace("\\neq", "\\ne").replace("\\leq", "\\le").replace("\\geq", "\\ge")
    text = text.replace("\\left", "").replace("\\right", "").replace("\\{", "{").replace("\\}", "}")
    without_unit = re.sub(r"\\text{.*?}$", "", text).strip()
    text = without_unit or text
    text = _drop_unit_words(text)
    text = text.replace("^{\\circ}", "").replace("^\\circ", "")
    text = text.replace("\\$", "").replace("$", "").replace("\\(", "").replace("\\)", "")
    text = _word_number(text)
    text = re.sub(r"\\text\{(.*?)\}", r"\1", text)
    for prefix in _PREFIXES:
        text = text.replace(prefix, "")
    text = text.replace("\\emptyset", "{}").replace("(-\\infty,\\infty)", "\\mathbb{R}")
    text = text.replace("\\%", "").replace("%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    text = text.replace("infinity", "\\infty")
    if "\\infty" not in text:
        text = text.replace("inf", "\\infty")
    text = text.replace("and", "").replace("\\mathbf", "")
    text = re.sub(r"\\mbox{.*?}", "", text)
    if "j" in text and "i" not in text:
        text = text.replace("j", "i")
    text = re.sub(r"(\d+)\.0*([^\d])", r"\1\2", text)
    text = re.sub(r"(\d+)\.0*$", r"\1", text)
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    text = re.sub(r"\\sqrt(\w+)", r"\\sqrt{\1}", text).replace(" ", "")
    return _slash_to_frac(_brace_fracs(text))


def _drop_unit_words(text: str) -> str:
    for _ in range(2):
        for pattern in _UNIT_PATTERNS:
            shorter = pattern.sub(r"\1\2", text)
            if shorter:
                text = shorter
    return text


def _word_number(text: str) -> str:
    """`five hundred` -> `500` when every word is a number word; anything else unchanged."""
    words = text.lower().replace("-", " ").split()
    if not words or any(w not in _SMALL_NUMBERS and w not in _TENS and w not in _SCALES and w != "and"
                        for w in words):
        return text
    total, group = 0, 0
    for word in words:
        if word in _SMALL_NUMBERS or word in _TENS:
            group += _SMALL_NUMBERS.get(word, _TENS.get(word, 0))
        elif word == "hundred":
            group = max(group, 1) * 100
        elif word in _SCALES:
            total, group = total + max(group, 1) * _SCALES[word], 0
    return str(total + group)


def _brace_fracs(text: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{72}` -> `\\frac{1}{72}`; braced ones unchanged."""
    head, *tails = text.split("\\frac")
    out = [head]
    for tail in tails:
        out.append("\\frac")
        if tail.startswith("{"):
            out.append(tail)
        elif len(tail) < 2:
            return text
        elif tail[1] == "{":
            out.append("{" + tail[0] + "}" + tail[1:])
        else:
            out.append("{" + tail[0] + "}{" + tail[1] + "}" + tail[2:])
    return "".join(out)


def _slash_to_frac(text: str) -> str:
    """`3/4` -> `\\frac{3}{4}` when both sides are integers (or hold a square root)."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    top, bottom = parts
    if all("sqrt" in side or re.fullmatch(r"-?\d+", side) for side in parts):
        if all("sqrt" in side or str(int(side)) == side for side in parts):
            return "\\frac{" + top + "}{" + bottom + "}"
    return text


# --- comparison ---------------------------------------------------------------------------

def _number(text: str) -> float | None:
    text = text.replace(",", "")
    try:
        return float(text)
    except ValueError:
        pass
    if text.endswith("%"):
        text = text[:-1].removesuffix("\\")
        try:
            return float(text) / 100
        except ValueError:
            return None
    return None


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL_TOL)


def _choice(prediction: str) -> str:
    text = prediction.strip("\n").rstrip(".").rstrip("/").strip(" ").lstrip(":")
    letters = re.findall(r"\b(A|B|C|D|E)\b", text.upper())
    return (letters[-1] if letters else text.strip().strip(".")).rstrip(".").rstrip("/")


def _set_as_matrix(reference: str) -> str:
    """`{1,2}` items written as a column matrix, for a matrix prediction against a set."""
    groups = re.findall(r"\{.*,.*\}", reference.strip())
    return ", ".join("\\begin{pmatrix}" + g.strip("{}").replace(",", "\\") + "\\end{pmatrix}" for g in groups)


def math_equal(prediction: str | None, reference: str | None) -> bool:
    """Whether two normalised answers are equal by the rules in the module docstring."""
    if prediction is None or reference is None:
        return False
    if prediction.strip().lower() == reference.strip().lower():
        return True
    if reference in _CHOICES and _choice(prediction) == reference:
        return True
    pred_number, ref_number = _number(prediction), _number(reference)
    if pred_number is not None and ref_number is not None:
        return any(_close(pred_number, target) for target in (ref_number / 100, ref_number, ref_number * 100))
    if not prediction:
        return False
    prediction, reference = prediction.strip(), reference.strip()
    if "pmatrix" in prediction and "pmatrix" not in reference:
        reference = _set_as_matrix(reference)
    return (_equal_without_brackets(prediction, reference) or _equal_items(prediction, reference)
            or _equal_matrices(prediction, reference) or _equal_equations(prediction, reference)
            or symbolic_equal(prediction, reference))


def _equal_without_brackets(prediction: str, reference: str) -> bool:
    pred, ref = prediction, reference
    listed = prediction.startswith("[") and prediction.endswith("]") and not reference.startswith("(")
    grouped = prediction.startswith("(") and prediction.endswith(")") and not reference.startswith("[")
    if listed or grouped:
        pred, ref = pred.strip("[]()"), ref.strip("[]()")
    pred, ref = re.sub(r"[{}()]", "", pred), re.sub(r"[{}()]", "", ref)
    return pred.lower() == ref.lower()


def _equal_items(prediction: str, reference: str) -> bool:
    if not (_BRACKETED.match(prediction) and _BRACKETED.match(reference)):
        return False
    pred_items, ref_items = prediction[1:-1].split(","), reference[1:-1].split(",")
    return len(pred_items) == len(ref_items) and all(math_equal(p, r) for p, r in zip(pred_items, ref_items))


def _equal_matrices(prediction: str, reference: str) -> bool:
    if not all(text.startswith(_MATRIX_OPEN) and text.endswith(_MATRIX_CLOSE) for text in (prediction, reference)):
        return False

    def rows(text: str) -> list[list[str]]:
        body = text[len("\\begin{pmatrix}"):-len("\\end{pmatrix}")]
        return [line.strip().split("&") for line in body.split("\\\\") if line.strip()]

    pred_rows, ref_rows = rows(prediction), rows(reference)
    return len(pred_rows) == len(ref_rows) and all(
        len(p) == len(r) and all(math_equal(a, b) for a, b in zip(p, r)) for p, r in zip(pred_rows, ref_rows))


def _equal_equations(prediction: str, reference: str) -> bool:
    if prediction.count("=") == 1 and reference.count("=") == 1:
        pred_left, pred_right = prediction.split("=")
        ref_left, ref_right = reference.split("=")
        pred = f"{pred_left.strip()} - ({pred_right.strip()})"
        ref = f"{ref_left.strip()} - ({ref_right.strip()})"
        return symbolic_equal(pred, ref) or symbolic_equal(f"-({pred})", ref)
    if prediction.count("=") == 1 and len(prediction.split("=")[0].strip()) <= 2 and "=" not in reference:
        return math_equal(prediction.split("=")[1], reference)
    if reference.count("=") == 1 and len(reference.split("=")[0].strip()) <= 2 and "=" not in prediction:
        return math_equal(prediction, reference.split("=")[1])
    return False


def _parse(text: str) -> Any:
    for parser in (latex2sympy, parse_expr):
        for candidate in (text.replace("\\\\", "\\"), text):
            try:
                return parser(candidate)
            except _OutOfTime:
                raise
            except Exception:
                continue
    return text


def _attempt(check: Callable[[], Any]) -> bool:
    try:
        return bool(check())
    except _OutOfTime:
        raise
    except Exception:
        return False


def symbolic_equal(a_text: str, b_text: str) -> bool:
    """Equal as sympy expressions: printed form, simplification, numeric value, or matrices."""
    a, b = _parse(a_text), _parse(b_text)
    return (_attempt(lambda: str(a) == str(b) or a == b)
            or _attempt(lambda: a.equals(b) or sympy.simplify(a - b) == 0)
            or _attempt(lambda: abs(a.lhs - a.rhs).equals(abs(b.lhs - b.rhs)))
            or _attempt(lambda: _close(float(sympy.N(a)), float(sympy.N(b))))
            or _attempt(lambda: a.shape == b.shape
                        and a.applyfunc(lambda x: round(x, 3)).equals(b.applyfunc(lambda x: round(x, 3)))))


# --- entry point --------------------------------------------------------------------------

def _within(seconds: float, check: Callable[[], bool]) -> bool:
    if threading.current_thread() is not threading.main_thread():
        return check()

    def out_of_time(signum: int, frame: Any) -> None:
        raise _OutOfTime

    previous = signal.signal(signal.SIGALRM, out_of_time)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return check()
    except _OutOfTime:
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@lru_cache(maxsize=65536)
def qwen_grade(prediction: str | None, reference: str) -> bool:
    """Whether `prediction` (an extracted answer) equals `reference` by Qwen2.5-Math's rules."""
    if not isinstance(prediction, str) or not isinstance(reference, str):
        return False
    return _within(TIMEOUT_S, lambda: math_equal(normalize(prediction), normalize(reference)))
