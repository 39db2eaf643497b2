"""Sequences (one token stream with its KV blocks) and the requests that own them."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from tts_runtime.engine.detokenizer import IncrementalDetokenizer
from tts_runtime.engine.request import FinishReason, SamplingParams, ScoreParams
from tts_runtime.engine.table_mirror import TableMirror


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    seq_id: int
    group: "RequestGroup"
    token_ids: list[int]
    index: int = 0  # child index within its request (n > 1)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    table_mirror: TableMirror = field(default_factory=TableMirror)  # block_table as int32, for batches
    # Chained hashes of this sequence's full blocks, in order (for registering new ones).
    block_hashes: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    # This child's sampling seed (None: the engine's unseeded stream); with the position it
    # fixes every draw, so a batch can be sampled in any process with the same tokens.
    seed: int | None = None
    detokenizer: IncrementalDetokenizer | None = None
    # Launched microbatches holding this sequence (the engine counts them): the scheduler
    # neither preempts it nor schedules it again, except, with async scheduling, a decode in
    # one microbatch, whose next decode is scheduled while this one runs (scheduler.py).
    in_flight: int = 0
    # A running decode's pipeline lane: microbatch k runs the decodes of lane k mod pp_size.
    lane: int | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return self.group.num_prompt_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_decode(self) -> bool:
        """Exactly one token to compute and it was sampled (not part of the prompt)."""
        return self.num_uncomputed_tokens == 1 and self.num_tokens > self.num_prompt_tokens

    @property
    def is_score(self) -> bool:
        return self.group.is_score


@dataclass(eq=False)
class RequestGroup:
    """One user request: a prompt plus its sequences (n children for generate)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams | ScoreParams
    sequences: list[Sequence] = field(default_factory=list)
    num_cached_prompt_tokens: int = 0
    prompt_looked_up: bool = False  # the scheduler has asked the prefix cache for the prompt
    aborted: bool = False  # its caller dropped it: nothing more is scheduled ahead for it
    # Score requests: results per requested position, filled as chunks complete.
    score_rows: dict[int, list[float]] = field(default_factory=dict)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def is_score(self) -> bool:
        return isinstance(self.params, ScoreParams)

    @property
    def finished(self) -> bool:
        if self.is_score:
            return len(self.score_rows) == len(self.params.positions)
        return (len(self.sequences) == self.params.n
                and all(s.status is SequenceStatus.FINISHED for s in self.sequences))
