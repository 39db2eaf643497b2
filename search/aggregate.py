"""Reduce a beam's per-step PRM scores to the one number beams are ranked by."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from tts_runtime.config import ConfigError

Aggregation = Literal["last", "min", "prod", "mean"]
AGGREGATIONS: tuple[str, ...] = ("last", "min", "prod", "mean")


def check_aggregation(method: str) -> Aggregation:
    if method not in AGGREGATIONS:
        raise ConfigError(f"unknown score aggregation '{method}'; choose one of {', '.join(AGGREGATIONS)}")
    return method  # type: ignore[return-value]


def aggregate(scores: Sequence[float], method: Aggregation = "last") -> float:
    """`last` (search-and-learn's default), `min`, `prod` or `mean` of the step scores.

    A beam with no scored step gets 0.0 whatever the method (not prod's empty 1.0 or
    min's +inf): it carries no evidence and must never outrank a scored beam."""
    check_aggregation(method)
    if not scores:
        return 0.0
    if method == "last":
        return scores[-1]
    if method == "min":
        return min(scores)
    if method == "prod":
        return math.prod(scores)
    return sum(scores) / len(scores)
