"""The answer a completion gives, read the way search-and-learn's math parser reads it.

Order (search-and-learn `qwen_math_parser.extract_answer` for MATH):
1. the last `\\boxed{...}` (or `\\fbox{...}`, `\\boxed 5`);
2. the text after the last "answer is" ("The answer is", "the final answer is: $x$");
3. the last number in the text.
The first rule that yields a non-empty answer wins; `None` only when none does.

Two departures, both because the reference reads more than the answer (see
docs/semantics.md): after "answer is" the reference keeps the rest of the whole text,
here the answer ends at the end of its line, its sentence or its `$...$`; and an empty
`\\boxed{}` falls through to the next rule instead of giving "".

The result is normalised like the reference's `strip_string`: presentation-only LaTeX
(`\\left`, `\\dfrac`, `^\\circ`, `\\%`, `$`, `\\text{...}`), trailing unit words, a short
left-hand side (`x = 5`), trailing `.0`, spaces, and `\\frac12`, `3/4`, `\\sqrt2` spelled out.
"""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_IS = re.compile(r"answer is\b", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d*\.?\d+")
# Where an answer after "answer is" stops: a sentence end (not a decimal point) or a line end.
_SENTENCE_END = re.compile(r"\.(?=\s|$)|\n")

# Unit words that follow a number in small models' answers ("12 cm", "5 dollars").
_UNITS = (
    "cm", "mm", "km", "m", "meters", "meter", "metres", "inches", "inch", "feet", "foot", "ft",
    "miles", "mile", "mph", "hours", "hour", "minutes", "minute", "seconds", "second", "days",
    "day", "years", "year", "degrees", "degree", "dollars", "dollar", "cents", "cent", "units",
    "unit", "square", "sq", "cubic", "kg", "g", "pounds", "lb", "liters", "litres", "points",
)
_UNIT_AFTER_NUMBER = re.compile(r"(?<=[\d}])\s*(?:(?:" + "|".join(_UNITS) + r")\b\s*(?:\^\{?[23]\}?)?\s*)+$")
_TRAILING_TEXT = re.compile(r"\\(?:text|mbox)\{[^{}]*\}\s*(?:\^\{?[23]\}?)?$")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}")
_SHORT_LHS = re.compile(r"^[A-Za-z](?:_\{?\w\}?)?\s*=\s*(?=\S)")
_WORDS_ONLY = re.compile(r"[A-Za-z]+(?: [A-Za-z]+)*")
_SMALL_NUMBERS = {word: str(i) for i, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}
_REPLACEMENTS = (
    ("\\!", ""), ("\\,", ""), ("\\;", ""),
    ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("bmatrix", "pmatrix"),
    ("\\neq", "\\ne"), ("\\leq", "\\le"), ("\\geq", "\\ge"),
    ("^{\\circ}", ""), ("^\\circ", ""), ("\\%", ""), ("%", ""),
    ("\\$", ""), ("$", ""), ("\\(", ""), ("\\)", ""), ("infinity", "\\infty"),
)


def extract_answer(text: str) -> str | None:
    """The normalised answer `text` gives, or None when it holds no candidate answer."""
    for rule in (_boxed_answer, _stated_answer, _last_number):
        raw = rule(text)
        answer = normalize_answer(raw) if raw is not None else ""
        if answer:
            return answer
    return None


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` / `\\fbox{...}` (brace-matched) or `\\boxed 5`."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = text[start + len(cmd):].lstrip()
    if rest.startswith("{"):
        return _braced(rest)
    # `\boxed 5`: the argument is the next token, up to whitespace or `$`.
    match = re.match(r"[^\s$]+", rest)
    return match.group(0) if match else None


def _braced(text: str) -> str | None:
    """`text` starts with `{`: what lies inside its matching `}` (None if unbalanced)."""
    depth = 0
    escaped = False
    for i, char in enumerate(text):
        if escaped:  # `\{` and `\}` are literal braces, not grouping
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[1:i]
    return None


def _boxed_answer(text: str) -> str | None:
    return extract_boxed(text)


def _stated_answer(text: str) -> str | None:
    matches = list(_ANSWER_IS.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end():].lstrip(" :\t")
    if rest.startswith("$"):
        closing = rest.find("$", 1)
        return rest[1:closing] if closing > 0 else rest[1:]
    end = _SENTENCE_END.search(rest)
    return rest[:end.start()] if end else rest


def _last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text.replace(",", ""))
    return numbers[-1] if numbers else None


def normalize_answer(answer: str) -> str:
    """An extracted answer without presentation-only LaTeX, units or spacing."""
    text = answer.replace("\n", " ").strip().rstrip(".").strip()
    text = re.sub(r"(?<!\\)\\ ", " ", text)  # a LaTeX space, not the row break `\\ `
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    text = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", text)
    text = _TRAILING_TEXT.sub("", text).strip() or text
    text = _TEXT_WRAPPER.sub(r"\1", text).strip()
    text = _UNIT_AFTER_NUMBER.sub("", text).strip() or text
    text = _SHORT_LHS.sub("", text)
    text = _SMALL_NUMBERS.get(text.lower(), text)
    text = re.sub(r"(\d)\.0+(?=\D|$)", r"\1", text)
    if text.startswith("."):
        text = "0" + text
    if not _WORDS_ONLY.fullmatch(text):  # "no solution" keeps its space; LaTeX loses all
        text = text.replace(" ", "")
    return _fix_slash(_fix_fracs(re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", text))).rstrip(".")


def _fix_fracs(text: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{7}` -> `\\frac{1}{7}`."""
    text = re.sub(r"\\frac(\w)(\w)", r"\\frac{\1}{\2}", text)
    return re.sub(r"\\frac(\w)\{", r"\\frac{\1}{", text)


def _fix_slash(text: str) -> str:
    """`3/4` (two integers, nothing else) -> `\\frac{3}{4}`."""
    match = re.fullmatch(r"(-?)(\d+)/(\d+)", text)
    return f"{match.group(1)}\\frac{{{match.group(2)}}}{{{match.group(3)}}}" if match else text
