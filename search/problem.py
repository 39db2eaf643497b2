"""A problem to search: the unit every layer above the engine passes around.

It lives in `search` (not in `evals`, which loads datasets into it) so that the search
layer never imports the evaluation layer above it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    id: str
    question: str
    answer: str
    level: int | None
    subject: str | None
