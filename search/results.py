"""What a search returns for one problem, and how the final answer is picked.

The final candidates (beam search: the kept completed beams; best-of-N: the N samples;
DVTS: every subtree's last candidates) are ranked by aggregated PRM score. `prediction`
is the answer of the best one (naive best-of-n, as search-and-learn's `pred`); weighted
and majority votes over the same candidates are reported beside it, weighted by each
candidate's `vote_aggregation` score as search-and-learn's score.py does.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from search.answers import extract_answer
from search.beam_state import Beam, StepCounts
from search.config import SearchConfig
from search.grading import grade, majority_pick, weighted_pick
from search.problem import Problem


@dataclass
class BeamResult:
    steps: list[str]
    step_scores: list[float]
    score: float  # aggregated step scores
    answer: str | None  # search.answers.extract_answer of the text
    finish_reason: str | None
    tokens: int  # generated tokens on this beam's path

    @property
    def text(self) -> str:
        return "".join(self.steps)


@dataclass
class ProblemResult:
    id: str
    level: int | None
    subject: str | None
    reference: str
    prediction: str | None
    correct: bool
    score: float
    weighted_prediction: str | None
    weighted_correct: bool
    majority_prediction: str | None
    majority_correct: bool
    beams: list[BeamResult] = field(default_factory=list)
    generated_tokens: int = 0
    prm_tokens: int = 0
    prm_cached_tokens: int = 0
    prm_requests: int = 0
    iterations: int = 0
    # Beam search: beams that completed; 0 means none did and `beams` are the survivors
    # (search-and-learn fails there).
    completed_beams: int = 0
    seconds: float = 0.0
    # Speculative beam extension (search/speculation.py): tokens of speculative steps, those
    # the search used (part of generated_tokens) and those dropped.
    speculative_tokens: int = 0
    speculative_kept_tokens: int = 0
    speculative_discarded_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> ProblemResult:
        beams = [BeamResult(**beam) for beam in row.get("beams", [])]
        return cls(**{**row, "beams": beams})


@dataclass
class FailedProblem:
    """A problem whose search raised. Its line in results.jsonl says so (`error`), the run
    goes on with the other problems, and `--resume` searches it again."""

    id: str
    level: int | None
    error: str  # one line: the exception's type and message

    @classmethod
    def of(cls, problem: Problem, exc: BaseException) -> FailedProblem:
        return cls(problem.id, problem.level, f"{type(exc).__name__}: {' '.join(str(exc).split())}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(problem: Problem, beams: list[Beam], config: SearchConfig, counts: StepCounts,
              seconds: float) -> ProblemResult:
    records = [
        BeamResult(list(beam.steps), list(beam.step_scores), beam.score(config.aggregation),
                   extract_answer(beam.text), beam.finish_reason, beam.generated_tokens)
        for beam in beams
    ]
    vote_weights = [beam.score(config.vote_aggregation) for beam in beams]
    candidates = [(record.answer, weight) for record, weight in zip(records, vote_weights)]
    best = max(records, key=lambda record: record.score, default=None)
    prediction = best.answer if best else None
    weighted = weighted_pick(candidates, config.vote_ties)  # type: ignore[arg-type]
    majority = majority_pick(candidates, config.vote_ties)  # type: ignore[arg-type]
    # The three predictions are usually one answer: grade each distinct one once.
    grades = {answer: grade(answer, problem.answer, config.grader) for answer in {prediction, weighted, majority}}
    return ProblemResult(
        id=problem.id, level=problem.level, subject=problem.subject, reference=problem.answer,
        prediction=prediction, correct=grades[prediction],
        score=best.score if best else 0.0,
        weighted_prediction=weighted, weighted_correct=grades[weighted],
        majority_prediction=majority, majority_correct=grades[majority],
        beams=records, generated_tokens=counts.generated_tokens, prm_tokens=counts.prm_tokens,
        prm_cached_tokens=counts.prm_cached_tokens, prm_requests=counts.prm_requests,
        iterations=counts.iterations, completed_beams=counts.completed_beams, seconds=seconds,
        speculative_tokens=counts.speculative_tokens, speculative_kept_tokens=counts.speculative_kept_tokens,
        speculative_discarded_tokens=counts.speculative_discarded_tokens)
