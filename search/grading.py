"""Equivalence grading and voting over extracted answers (MATH-style problems).

The answers come from `search.answers.extract_answer`; a reference answer is compared
with `grade`, and scored candidates are reduced to one answer with `vote`."""

from __future__ import annotations

import logging
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Literal

from math_verify import parse, verify
from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

from search.answers import extract_boxed
from search.qwen_grader import qwen_grade
from tts_runtime.config import ConfigError

# math_verify logs a warning for every unparsable string; graders see many of those.
logging.getLogger("math_verify").setLevel(logging.ERROR)

VoteMethod = Literal["naive", "weighted", "maj"]
VoteTies = Literal["first", "best"]
VOTE_TIES: tuple[str, ...] = ("first", "best")
# "math-verify": math-verify's equivalence after our clean-up (`normalize`); "qwen":
# Qwen2.5-Math's math_equal rules (search.qwen_grader), as search-and-learn's evaluation.
GRADERS: tuple[str, ...] = ("math-verify", "qwen")

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_TIMEOUT_S = 5
_EXTRACTION = (LatexExtractionConfig(), ExprExtractionConfig())


# Unit words that MATH answers append with \mbox / \text (e.g. `864 \mbox{ inches}^2`).
_UNIT_SUFFIX = re.compile(r"\\(?:mbox|text|textnormal)\{\s*[a-zA-Z][a-zA-Z .]*\}(?:\^\{?\d\}?)?\s*$")
_TEXT_WRAPPER = re.compile(r"\\(?:mbox|text|textbf|textnormal|mathrm)\{([^{}]*)\}")
# math_verify would read `east` as the product e*a*s*t, equal to `teas`; words compare as text.
_WORD = re.compile(r"[A-Za-z]{2,}(?: [A-Za-z]+)*")
_CHOICE = re.compile(r"^\(?([A-E])\)?$")
# `10,\!080` always groups thousands; a bare `58,500` only when it is the whole answer,
# since `(2,12) \cup (12,102)` holds commas that separate numbers.
_LATEX_THOUSANDS = re.compile(r"(\d),\\!\s*(?=\d{3})")
_PLAIN_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_DELIMITER_SIZING = re.compile(r"\\(?:left|right)(?![a-zA-Z])")
_REPLACEMENTS = (
    ("\\!", ""),
    ("\\,", ""),
    ("\\;", ""),
    ("\\ ", " "),
    ("\\dfrac", "\\frac"),
    ("\\tfrac", "\\frac"),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\%", ""),
    ("%", ""),
    ("\\$", ""),
    ("$", ""),
)


@lru_cache(maxsize=65536)
def normalize(text: str) -> str:
    """Strip presentation-only LaTeX (units, degrees, percent, dollars, spacing) from an answer."""
    text = text.strip()
    if text.startswith(_BOX_COMMANDS):
        text = extract_boxed(text) or text
    text = _LATEX_THOUSANDS.sub(r"\1", text)
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    text = _DELIMITER_SIZING.sub("", text)
    text = _UNIT_SUFFIX.sub("", text).strip() or text
    text = _TEXT_WRAPPER.sub(r"\1", text).strip()
    choice = _CHOICE.match(text)
    if choice:
        return choice.group(1)
    if _PLAIN_THOUSANDS.match(text):
        text = text.replace(",", "")
    return text.rstrip(".").strip()


def _word(normalized: str) -> str | None:
    return normalized.lower() if _WORD.fullmatch(normalized) else None


def _timeout() -> int | None:
    # math_verify's timeouts use SIGALRM, which only the main thread may install.
    return _TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=65536)
def _parsed(answer: str) -> tuple:
    normalized = normalize(answer)
    if not normalized:
        return ()
    try:
        return tuple(parse(f"${normalized}$", extraction_config=_EXTRACTION, parsing_timeout=_timeout()))
    except Exception:
        return ()


def grade(prediction: str | None, reference: str, grader: str = "math-verify") -> bool:
    """Whether `prediction` (an answer, not a full solution) equals the `reference` answer."""
    if grader == "qwen":
        return qwen_grade(prediction, reference)
    return _math_verify_grade(prediction, reference)


def check_grader(grader: str) -> str:
    if grader not in GRADERS:
        raise ConfigError(f"unknown grader '{grader}'; choose one of {', '.join(GRADERS)}")
    return grader


@lru_cache(maxsize=65536)
def _math_verify_grade(prediction: str | None, reference: str) -> bool:
    if not isinstance(prediction, str) or not isinstance(reference, str):
        return False
    pred_norm, ref_norm = normalize(prediction), normalize(reference)
    if pred_norm == ref_norm:
        return True
    if _word(ref_norm) is not None:
        return _word(pred_norm) == _word(ref_norm)
    gold, pred = _parsed(reference), _parsed(prediction)
    if not gold or not pred:
        return False
    try:
        return bool(verify(list(gold), list(pred), timeout_seconds=_timeout()))
    except Exception:
        return False


@lru_cache(maxsize=65536)
def canonical_answer(text: str | None) -> str | None:
    """A string that equal answers share, used as the voting key."""
    if text is None:
        return None
    normalized = normalize(text)
    word = _word(normalized)
    if word is not None:
        return word
    parsed = _parsed(text)
    if parsed:
        return str(parsed[0])
    return normalized or None


def naive_pick(candidates: Sequence[tuple[str | None, float]]) -> str | None:
    """The answer of the single highest-scoring candidate (the first of equal scores)."""
    if not candidates:
        return None
    return max(candidates, key=lambda c: c[1])[0]


def weighted_pick(candidates: Sequence[tuple[str | None, float]], ties: VoteTies = "first") -> str | None:
    """The answer whose equivalent candidates have the largest total score."""
    return _pick(candidates, lambda members: sum(score for _, score in members), ties)


def majority_pick(candidates: Sequence[tuple[str | None, float]], ties: VoteTies = "first") -> str | None:
    """The most frequent answer."""
    return _pick(candidates, len, ties)


def vote(candidates: Sequence[tuple[str | None, float]], method: VoteMethod,
         ties: VoteTies = "first") -> str | None:
    """Pick an answer from scored candidates with `naive`, `weighted` or `maj` voting."""
    if method == "naive":
        return naive_pick(candidates)
    if method == "weighted":
        return weighted_pick(candidates, ties)
    if method == "maj":
        return majority_pick(candidates, ties)
    raise ValueError(f"unknown vote method '{method}'; choose naive, weighted or maj")


def check_vote_ties(ties: str) -> VoteTies:
    if ties not in VOTE_TIES:
        raise ConfigError(f"unknown vote tie rule '{ties}'; choose one of {', '.join(VOTE_TIES)}")
    return ties  # type: ignore[return-value]


Members = list[tuple[str | None, float]]


def _pick(candidates: Sequence[tuple[str | None, float]], weight: Callable[[Members], float],
          ties: VoteTies) -> str | None:
    """The group of equivalent answers with the largest weight.

    `first` (search-and-learn): of equal weights the group seen first wins, named by its
    first member. `best`: the group holding the higher single score wins, named by its
    best-scored member."""
    groups = _group(candidates)
    if not groups:
        return None
    if ties == "first":
        return max(groups.values(), key=weight)[0][0]
    best = max(groups.values(), key=lambda members: (weight(members), _best_score(members)))
    return max(best, key=lambda c: c[1])[0]


def _group(candidates: Sequence[tuple[str | None, float]]) -> dict[str, Members]:
    # Candidates without an answer cannot win a vote: many unfinished beams must not outvote
    # one answer (search-and-learn groups their "" like an answer).
    groups: dict[str, Members] = defaultdict(list)
    for answer, score in candidates:
        key = canonical_answer(answer)
        if key is not None:
            groups[key].append((answer, score))
    return groups


def _best_score(members: Members) -> float:
    return max(score for _, score in members)
