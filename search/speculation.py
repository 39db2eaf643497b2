"""FastTTS's speculative beam extension (arXiv 2509.00195) for one problem's beam search.

Within an iteration, a beam whose step has finished would sit idle until the slowest beam
of the iteration and the PRM are done. Instead it starts its next step at once, as a
speculative request. When selection ends, a surviving beam's speculation stands in for
the first copy of the survivor in the next iteration (refill copies it n // keep times and
each copy has its own seed: the speculation used the first copy's seed, so it can replace
that copy only); the speculations of beams that did not survive are aborted and their
blocks freed. The seed of a step is keyed by the beam's tokens (`search.beam_state.step_seed`),
so a speculative step samples exactly the tokens the regular step would: the search makes
the same decisions with speculation on or off.

Work is bounded: one speculative step per beam (a speculation never speculates), none past
the last iteration, and `SearchConfig.speculative_max_tokens` caps each one; a speculation
cut short by that cap is discarded and the step generated anew. PRM scoring never waits on
a speculation: they run side by side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

from search.beam_state import Beam, StepCounts
from search.config import SearchConfig
from tts_runtime.cohost.runtime import Runtime
from tts_runtime.engine.request import RequestOutput, SamplingParams

# (beam, iteration, to_eos) -> the params of the beam's step at that iteration (first child)
ParamsFor = Callable[[Beam, int, bool], SamplingParams]
Key = tuple[int, ...]


@dataclass
class Speculation:
    future: asyncio.Future
    max_tokens: int  # this request's cap
    step_max_tokens: int  # the cap the regular step would have

    def stands_in(self, output: RequestOutput) -> bool:
        """The whole step: it ended on its own (stop string, EOS), or it had the step's cap."""
        return self.max_tokens == self.step_max_tokens or output.completions[0].finish_reason != "length"


class Speculator:
    """One problem's speculative steps: started as beams finish, taken or dropped per iteration."""

    def __init__(self, runtime: Runtime, config: SearchConfig, counts: StepCounts, params_for: ParamsFor) -> None:
        self.runtime = runtime
        self.config = config
        self.counts = counts
        self.params_for = params_for
        self._next: dict[Key, Speculation] = {}  # started for the iteration after this one
        self._current: dict[Key, Speculation] = {}  # started for this iteration, not yet taken
        self._iteration = 0
        self._closed = False

    def begin(self, iteration: int) -> None:
        """Iteration `iteration` expands now: last iteration's speculations become takeable."""
        self._iteration = iteration
        self._current, self._next = self._next, {}

    def to_eos(self, iteration: int) -> bool:
        """Whether `iteration` runs to the end (beam search's last iteration, eos_sampling)."""
        return iteration == self.config.num_iterations - 1 and self.config.eos_sampling

    def start(self, beam: Beam) -> None:
        """`beam` just finished its step: start its next one, unless nothing would follow."""
        iteration = self._iteration + 1
        key = tuple(beam.token_ids)
        if self._closed or beam.completed or iteration >= self.config.num_iterations or key in self._next:
            return
        params = self.params_for(beam, iteration, self.to_eos(iteration))
        capped = params.max_tokens
        if self.config.speculative_max_tokens is not None:
            capped = min(capped, self.config.speculative_max_tokens)
        future = self.runtime.submit_generate(beam.token_ids, replace(params, max_tokens=capped))
        self._next[key] = Speculation(future, capped, params.max_tokens)

    def take(self, beam: Beam) -> Speculation | None:
        """The speculation of a surviving beam, for its first copy in this iteration."""
        return self._current.pop(tuple(beam.token_ids), None)

    async def result(self, speculation: Speculation) -> RequestOutput | None:
        """The speculative step, or None when it was cut short (counted as discarded)."""
        output: RequestOutput = await speculation.future
        tokens = len(output.completions[0].token_ids)
        self.counts.speculative_tokens += tokens
        if not speculation.stands_in(output):
            self.counts.speculative_discarded_tokens += tokens
            return None
        self.counts.speculative_kept_tokens += tokens
        return output

    def drop_untaken(self) -> None:
        """Selection is over: the speculations nobody took belong to beams that did not survive."""
        for speculation in self._current.values():
            self._discard(speculation)
        self._current = {}

    def close(self) -> None:
        """The search ended (or was stopped): abort whatever is still speculating."""
        self._closed = True
        for speculation in [*self._current.values(), *self._next.values()]:
            self._discard(speculation)
        self._current, self._next = {}, {}

    def _discard(self, speculation: Speculation) -> None:
        future = speculation.future
        if future.done() and not future.cancelled():
            tokens = len(future.result().completions[0].token_ids)
        else:
            tokens = self.runtime.abort(future)
        self.counts.speculative_tokens += tokens
        self.counts.speculative_discarded_tokens += tokens
