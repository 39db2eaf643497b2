"""Where a simulated generator's tokens come from: a seeded draw shaped like a real run
(`ProfileTokens`, the default), or recorded token streams played back (`ReplayTokens`, to
check that the simulated device schedules exactly as the real one does).

A token depends only on its `SamplingRow` (the sequence so far, the child's seed), never on
what else shares the batch, as with the real sampler. Every request of a search is one step
(it stops at the delimiter), so the tokens generated so far are the current step's."""

from __future__ import annotations

from typing import Protocol

from tts_runtime.executor.sampler import SamplingRow
from tts_runtime.executor.sim_profile import SimProfile

_MASK64 = (1 << 64) - 1


class TokenSource(Protocol):
    def next_token(self, row: SamplingRow) -> int: ...


def mix_uniform(seed: int, position: int, salt: int) -> float:
    """A number in [0, 1) from (seed, position, salt): splitmix64, cheap enough for every token."""
    z = (seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9 + salt) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return ((z ^ (z >> 31)) >> 11) / float(1 << 53)


class ProfileTokens:
    """Per token, memoryless: the step ends at token k + 1 with the profile's hazard at k
    (k = tokens of this step so far); an ending step ends the beam (EOS) with the EOS hazard
    of its step index, else with the delimiter; otherwise an ordinary token."""

    def __init__(self, profile: SimProfile, seed: int = 0) -> None:
        self.profile = profile
        self.seed = seed
        self._step_end = profile.step_end_hazard()
        self._eos = profile.eos_hazard()
        self._ordinary = profile.ordinary_token_ids
        self._unseeded = 0  # rows without a seed draw from a counter

    def next_token(self, row: SamplingRow) -> int:
        k = row.num_tokens - row.num_prompt_tokens
        seed = row.seed
        if seed is None:
            self._unseeded += 1
            seed = self._unseeded
        seed ^= self.seed
        position = row.num_tokens
        ends = mix_uniform(seed, position, 1) < (self._step_end[k] if k < len(self._step_end) else 1.0)
        if ends:
            j = self.step_index(row.tokens())
            eos = self._eos[j] if j < len(self._eos) else 1.0
            return self.profile.eos_token_id if mix_uniform(seed, position, 2) < eos else self.profile.separator_token_id
        return self._ordinary[int(mix_uniform(seed, position, 3) * len(self._ordinary))]

    def step_index(self, token_ids: list[int]) -> int:
        """Steps already in the prompt: delimiters after the last chat-turn token (once per
        step, so the scan is off the per-token path)."""
        turn = self.profile.turn_token_id
        start = 0
        if turn is not None:
            for i in range(len(token_ids) - 1, -1, -1):
                if token_ids[i] == turn:
                    start = i
                    break
        tail = token_ids[start:]
        count, i = 0, 0
        while i < len(tail):
            for pattern in self.profile.separator_ids:
                if tail[i:i + len(pattern)] == pattern:
                    count += 1
                    i += len(pattern) - 1
                    break
            i += 1
        return count


class ReplayTokens:
    """Plays back recorded outputs, keyed by prompt: token k of a sequence is token k of the
    stream recorded for its prompt (n = 1 requests; a forked request's children would share it)."""

    def __init__(self, streams: dict[tuple[int, ...], list[int]]) -> None:
        self.streams = streams

    def next_token(self, row: SamplingRow) -> int:
        stream = self.streams[tuple(row.token_ids[: row.num_prompt_tokens])]
        return stream[row.num_tokens - row.num_prompt_tokens]
