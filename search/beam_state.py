"""A beam: one partial solution, as the generator's token ids and the PRM's step texts.

The searches (beam search, best-of-N, DVTS) only touch beams and a `StepBackend`, which
generates the next step(s) of many beams at once and PRM-scores them. The engine-backed
backend lives in `search.session`; `evals.baselines` plugs in plain HF transformers, so
both run exactly the same search code.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from typing import Any, Protocol

from search.aggregate import aggregate
from search.config import STEP_DELIMITER, SearchConfig

# finish reasons: the generator's "eos"/"length", "empty" (the step held no text) and
# "answer" (DVTS stops a subtree once its text holds a boxed answer, as search-and-learn).
FINISH_EMPTY = "empty"
FINISH_LENGTH = "length"
FINISH_ANSWER = "answer"


@dataclass
class Beam:
    token_ids: list[int]  # prompt + every generated token, exactly as sampled
    prompt_len: int
    steps: list[str] = field(default_factory=list)
    # One per step once scored; under `sal_empty_step` one more for the empty step after a
    # text that ends in the delimiter (search-and-learn's `all_scores`).
    step_scores: list[float] = field(default_factory=list)
    finish_reason: str | None = None  # None while the beam may still grow
    # The running hash of token_ids that keys the beam's step seed; a child continues its
    # parent's, so a step hashes the tokens it added, not its whole context again (~115 us at
    # 3,000 tokens, in the gap between a PRM forward and the generator's next one).
    _token_hash: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def completed(self) -> bool:
        return self.finish_reason is not None

    @property
    def text(self) -> str:
        return "".join(self.steps)

    @property
    def generated_tokens(self) -> int:
        return len(self.token_ids) - self.prompt_len

    def score(self, aggregation: str) -> float:
        return aggregate(self.step_scores, aggregation)  # type: ignore[arg-type]

    def child(self, token_ids: list[int], text: str, finish_reason: str | None, *, max_len: int) -> Beam:
        """This beam plus one generation (a step, or a whole solution split into steps).

        The child completes on EOS, a length stop (the step cap, or the generator's context
        of `max_len` tokens is full: vLLM's rule, which search-and-learn inherits), or a step
        holding no text. A whitespace-only step also counts as empty: search-and-learn ends a
        beam only on a step of zero characters and scores a blank step like any other."""
        ids = self.token_ids + list(token_ids)
        new_steps = split_steps(text)
        reason = finish_reason if finish_reason in ("eos", "length") else None
        if reason is None and not new_steps:
            reason = FINISH_EMPTY
        if reason is None and len(ids) >= max_len:
            reason = FINISH_LENGTH
        child = Beam(ids, self.prompt_len, self.steps + new_steps, self.step_scores[:len(self.steps)], reason)
        if self._token_hash is not None:
            child._token_hash = self._token_hash.copy()
            child._token_hash.update(_token_bytes(token_ids))
        return child

    def token_digest(self) -> str:
        """The key of this beam's step seed: hashed whole once, then continued by its children."""
        if self._token_hash is None:
            self._token_hash = hashlib.blake2b(_token_bytes(self.token_ids), digest_size=16)
        return self._token_hash.hexdigest()


def _token_bytes(token_ids: list[int]) -> bytes:
    return array("q", token_ids).tobytes()


def split_steps(text: str) -> list[str]:
    """Steps of a generation, each keeping its trailing delimiter; blank pieces are dropped
    (they carry nothing to score)."""
    pieces = text.split(STEP_DELIMITER)
    steps = [piece + STEP_DELIMITER for piece in pieces[:-1]] + [pieces[-1]]
    return [step for step in steps if step.strip()]


def step_seed(run_seed: int, problem_id: str, iteration: int, beam: Beam) -> int:
    """The seed of the request that extends `beam` at `iteration`. It is keyed by the beam's
    tokens, not by its place in the iteration's list: a speculative next step, started
    before selection decides that list, then samples exactly what the step would."""
    return derive_seed(run_seed, problem_id, iteration, beam.token_digest())


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from (run seed, problem id, iteration, beam index): stable across
    processes (unlike hash() of a str) and independent of what else shares a batch."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class StepCounts:
    """Per-problem work: what the generator produced and what the PRM was sent."""

    generated_tokens: int = 0
    prm_tokens: int = 0  # tokens in the score requests sent to the PRM
    prm_cached_tokens: int = 0  # of those, served from the PRM's prefix cache
    prm_requests: int = 0
    iterations: int = 0
    completed_beams: int = 0  # beam search: beams that completed (0: the result holds survivors)
    # Speculative beam extension: tokens of speculative steps, split into those the search
    # used (also in generated_tokens) and those dropped (extra generator work).
    speculative_tokens: int = 0
    speculative_kept_tokens: int = 0
    speculative_discarded_tokens: int = 0


class StepBackend(Protocol):
    config: SearchConfig
    counts: StepCounts

    def root(self) -> Beam:
        """The empty solution: just the prompt."""

    async def expand(self, beams: list[Beam], iteration: int, *, width: int = 1,
                     to_eos: bool = False, greedy: bool = False) -> list[list[Beam]]:
        """`width` children per beam: one more step each, or (to_eos) the rest of the solution;
        `greedy` decodes at temperature 0 whatever the configured temperature (lookahead)."""

    async def score(self, beams: list[Beam]) -> None:
        """Fill every beam's `step_scores` for all its steps."""
