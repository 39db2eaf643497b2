"""Phase scheduling of the co-hosted pair: which engines step next.

`alternate` (the runtime's original behaviour) steps every engine that has work, generator
then PRM, each runtime step. `batched` is Seesaw's transition-minimising rule (§4.2) applied
to the pair: run one engine's phase across all in-flight problems and switch only when a
buffer is full or a side runs dry. In a generator phase the problems that finish a step
queue their scores on the PRM; in a PRM phase the problems whose scores arrive queue their
next step on the generator. So:

* generator -> PRM when the generator's unfinished sequences fall to `generator_low_water`
  (0: it ran dry) or the PRM's pending uncached prompt tokens reach `prm_buffer_tokens`;
* PRM -> generator when the PRM is drained or the generator's unfinished sequences reach
  `generator_buffer_seqs`.

An engine that has no work never keeps the turn while the other has some, so a search
waiting on scores while the generator is idle always gets them: the rule cannot deadlock.

Under `overlap` the engines do not take turns on one device, so a phase there is only the
PRM's batching window: the generator keeps decoding in every step it has work, and the PRM
launches while its phase is on (same switching rule). Without this the two overlapped
workers would run one at a time, each on its half of the cores.
"""

from __future__ import annotations

from typing import Protocol

from tts_runtime.config import CohostConfig

GENERATOR, PRM = "generator", "prm"
ORDER = (GENERATOR, PRM)


class PhaseEngine(Protocol):
    @property
    def num_unfinished_sequences(self) -> int: ...

    def pending_prefill_tokens(self) -> int: ...


class PhaseScheduler:
    def __init__(self, config: CohostConfig) -> None:
        self.config = config
        self.phase = GENERATOR

    def choose(self, runnable: set[str], engines: dict[str, PhaseEngine]) -> list[str]:
        """The engines to step now, in order, among `runnable` (those with work, and under the
        elastic policy the memory to run)."""
        if self.config.phase_policy == "alternate":
            return [name for name in ORDER if name in runnable]
        other = PRM if self.phase == GENERATOR else GENERATOR
        if other in runnable and (self.phase not in runnable or self._buffer_says_switch(engines)):
            self.phase = other
        if self.config.overlap:
            return [name for name in ORDER if name in runnable and (name == GENERATOR or self.phase == PRM)]
        return [self.phase] if self.phase in runnable else []

    def _buffer_says_switch(self, engines: dict[str, PhaseEngine]) -> bool:
        config = self.config
        generator_seqs = engines[GENERATOR].num_unfinished_sequences
        if self.phase == GENERATOR:
            return (generator_seqs <= config.generator_low_water
                    or engines[PRM].pending_prefill_tokens() >= config.prm_buffer_tokens)
        return generator_seqs >= config.generator_buffer_seqs
