"""Request kinds the engine serves and what it returns for them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tts_runtime.config import ConfigError

FinishReason = Literal["stop", "eos", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to generate. temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    n: int = 1
    # Children are numbered from here for their seeds (child_seed(seed, first_child + i)):
    # a request can sample exactly the children i.. of another request with the same seed.
    first_child: int = 0
    max_tokens: int = 16
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        checks = [
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"top_k must be >= 0 (0 disables it), got {self.top_k}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.repetition_penalty > 0, f"repetition_penalty must be > 0, got {self.repetition_penalty}"),
            (-2 <= self.frequency_penalty <= 2, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (-2 <= self.presence_penalty <= 2, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (self.n >= 1, f"n must be >= 1, got {self.n}"),
            (self.first_child >= 0, f"first_child must be >= 0, got {self.first_child}"),
            (self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}"),
            (all(s for s in self.stop), "stop strings must be non-empty"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"invalid sampling parameter: {message}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                or self.presence_penalty != 0.0)


@dataclass(frozen=True)
class ScoreParams:
    """Prefill only. For each position p, the next-token distribution at p restricted to
    `candidate_token_ids`: softmax over those ids (or their raw logits)."""

    positions: tuple[int, ...]
    candidate_token_ids: tuple[int, ...]
    return_logits: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "positions", tuple(self.positions))
        object.__setattr__(self, "candidate_token_ids", tuple(self.candidate_token_ids))
        if not self.positions:
            raise ConfigError("invalid score request: positions must not be empty")
        if not self.candidate_token_ids:
            raise ConfigError("invalid score request: candidate_token_ids must not be empty")


class RequestError(ConfigError):
    """A request the engine cannot serve as given."""


def validate_request(token_ids: list[int], params: SamplingParams | ScoreParams, vocab_size: int,
                     max_model_len: int, model: str, too_long_hint: str = "shorten the prompt") -> None:
    """What every engine checks before it takes a request (`model` names it in the errors)."""
    if not token_ids:
        raise RequestError("empty prompt: a request needs at least one token")
    if len(token_ids) >= max_model_len:
        raise RequestError(f"prompt has {len(token_ids)} tokens but {model} has a context of {max_model_len}; "
                           f"{too_long_hint}")
    if max(token_ids) >= vocab_size or min(token_ids) < 0:
        raise RequestError(f"prompt token ids must be in [0, {vocab_size})")
    if isinstance(params, ScoreParams):
        bad = [p for p in params.positions if not 0 <= p < len(token_ids)]
        if bad:
            raise RequestError(f"score positions {bad} outside the prompt of {len(token_ids)} tokens")
        if max(params.candidate_token_ids) >= vocab_size or min(params.candidate_token_ids) < 0:
            raise RequestError(f"candidate token ids must be in [0, {vocab_size})")


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int]
    text: str
    finish_reason: FinishReason | None = None


@dataclass
class RequestOutput:
    """A finished request. `completions` for generate, `scores` ([position][candidate]) for score."""

    request_id: str
    prompt_token_ids: list[int]
    completions: list[CompletionOutput] = field(default_factory=list)
    scores: list[list[float]] | None = None
    num_cached_prompt_tokens: int = 0
