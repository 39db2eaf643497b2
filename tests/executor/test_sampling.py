"""Sampling filters and penalties change the next-token distribution as specified.

Each case writes out, by hand, the logits the sampler should end up with (after
temperature and penalties) and which tokens the filters keep; the test derives the
expected distribution from those with plain `math.exp`. The sampler inverts the CDF with
one number per row, and a seeded row's number is `seeded_uniform(seed, position)`, so for
every seed the expected token is known exactly: no statistics, and the whole distribution
is checked (every kept token is drawn for some seed, no dropped one ever is)."""

from __future__ import annotations

import bisect
import math

import pytest
import torch

from tts_runtime.engine.request import SamplingParams
from tts_runtime.executor.sampler import SamplingRow, sample, seeded_uniform

LOGITS = [2.0, 1.0, 0.5, 0.0, -1.0]
PROMPT = [3, 0, 4]  # the repetition penalty reads prompt and output; the others only output
SEEDS = range(400)


def _expected_token(logits: list[float], kept: list[int], u: float) -> int:
    weights = [math.exp(logits[i]) if i in kept else 0.0 for i in range(len(logits))]
    total = sum(weights)
    cdf = [sum(weights[:i + 1]) / total for i in range(len(weights))]
    return min(bisect.bisect_left(cdf, u), len(logits) - 1)


def _draws(params: SamplingParams, output: list[int]) -> list[tuple[int, float]]:
    """(token, the row's uniform number) for every seed, all seeds in one batch."""
    token_ids = PROMPT + output
    rows = [SamplingRow(params, token_ids, len(PROMPT), seed, len(token_ids)) for seed in SEEDS]
    tokens = sample(torch.tensor([LOGITS] * len(rows)), rows, torch.Generator().manual_seed(0))
    return [(token, 1.0 - seeded_uniform(seed, len(token_ids))) for token, seed in zip(tokens, SEEDS)]


CASES = {
    # name: (params, output so far, logits after temperature and penalties, kept tokens)
    "plain": (SamplingParams(), [], LOGITS, [0, 1, 2, 3, 4]),
    "temperature 0.5": (SamplingParams(temperature=0.5), [], [4.0, 2.0, 1.0, 0.0, -2.0], [0, 1, 2, 3, 4]),
    # top-k 2: the two largest logits.
    "top-k": (SamplingParams(top_k=2), [], LOGITS, [0, 1]),
    # softmax(LOGITS) = .563 .207 .126 .076 .028: mass before token 2 is .770 < .8, before
    # token 3 it is .896, so top-p .8 keeps tokens 0, 1, 2.
    "top-p": (SamplingParams(top_p=0.8), [], LOGITS, [0, 1, 2]),
    # min-p .3: tokens with probability >= .3 * .563 = .169, i.e. 0 and 1.
    "min-p": (SamplingParams(min_p=0.3), [], LOGITS, [0, 1]),
    # Repetition 2 on every token seen (prompt 3, 0, 4 and output 1): a positive logit is
    # divided by 2, a negative one multiplied, zero stays.
    "repetition": (SamplingParams(repetition_penalty=2.0), [1], [1.0, 0.5, 0.5, 0.0, -2.0], [0, 1, 2, 3, 4]),
    # Frequency .5 per occurrence in the output (token 1 twice, token 2 once).
    "frequency": (SamplingParams(frequency_penalty=0.5), [1, 2, 1], [2.0, 0.0, 0.0, 0.0, -1.0], [0, 1, 2, 3, 4]),
    # Presence .75 once per distinct output token, however often it occurs.
    "presence": (SamplingParams(presence_penalty=0.75), [1, 2, 1], [2.0, 0.25, -0.25, 0.0, -1.0],
                 [0, 1, 2, 3, 4]),
    # Penalties apply before the filters: repetition makes tokens 0..2 the top-3 of
    # 1.0, 0.5, 0.5, 0.0, -2.0.
    "repetition then top-k": (SamplingParams(repetition_penalty=2.0, top_k=3), [1], [1.0, 0.5, 0.5, 0.0, -2.0],
                              [0, 1, 2]),
}


@pytest.mark.parametrize("name", CASES)
def test_distribution_matches_hand_computed_values(name):
    params, output, logits, kept = CASES[name]
    draws = _draws(params, output)
    assert [token for token, _ in draws] == [_expected_token(logits, kept, u) for _, u in draws]
    assert {token for token, _ in draws} == set(kept)  # every kept token drawn, no other


def test_greedy_takes_the_largest_penalised_logit():
    row = SamplingRow(SamplingParams(temperature=0.0, repetition_penalty=4.0), PROMPT + [1], len(PROMPT), None,
                      len(PROMPT) + 1)
    # 2.0 / 4 = .5 for token 0 (in the prompt), 1.0 / 4 for token 1: token 2's .5 ties
    # with token 0, and argmax takes the first.
    assert sample(torch.tensor([LOGITS]), [row], None) == [0]
    frequency = SamplingRow(SamplingParams(temperature=0.0, frequency_penalty=2.0), PROMPT + [0], len(PROMPT), None,
                            len(PROMPT) + 1)
    assert sample(torch.tensor([LOGITS]), [frequency], None) == [1]  # 2.0 - 2 = 0 < 1.0


def test_penalties_leave_the_callers_logits_alone():
    logits = torch.tensor([LOGITS])
    row = SamplingRow(SamplingParams(repetition_penalty=2.0, presence_penalty=1.0), PROMPT + [1], len(PROMPT), 7,
                      len(PROMPT) + 1)
    sample(logits, [row], None)
    assert logits.tolist() == [LOGITS]


@pytest.mark.parametrize("appended", [False, True])
def test_a_row_going_ahead_reads_its_filled_token_and_only_its_own_tokens(appended):
    """Async scheduling: a row shares its sequence's list, which may or may not hold the
    token still in flight yet (the executor sets it as `filled_token`) and grows past the
    row later; the row samples as if it held exactly its own tokens."""
    params = SamplingParams(temperature=0.9, repetition_penalty=4.0, frequency_penalty=1.0, seed=3)
    whole = SamplingRow(params, PROMPT + [1, 2], len(PROMPT), 11, len(PROMPT) + 2)
    live = PROMPT + [1] + ([2] if appended else [])
    ahead = SamplingRow(params, live, len(PROMPT), 11, len(PROMPT) + 2, filled_token=2)
    live.extend([0, 0, 0])  # later tokens of the sequence: not this row's
    assert ahead.tokens() == whole.tokens() == PROMPT + [1, 2]
    other = SamplingRow(params, PROMPT + [1, 0], len(PROMPT), 0, len(PROMPT) + 2)  # another last token
    differs = False
    for seed in SEEDS:
        whole.seed = ahead.seed = other.seed = seed
        token = sample(torch.tensor([LOGITS]), [whole], None)
        assert sample(torch.tensor([LOGITS]), [ahead], None) == token
        differs |= sample(torch.tensor([LOGITS]), [other], None) != token
    assert differs  # the penalties do read the last token
