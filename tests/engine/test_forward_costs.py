"""Forward cost fit: the sums recover a linear cost, subtract like counters, and the engine
times every forward it runs."""

from __future__ import annotations

import pytest

from tts_runtime.config import EngineConfig
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.forward_costs import ForwardCost, ForwardCostSums, widest_forward_seconds
from tts_runtime.engine.request import SamplingParams

COST = ForwardCost(fixed_seconds=0.024, seconds_per_decode=0.001, seconds_per_prefill_token=0.00025)
SHAPES = [(1, 0), (4, 0), (16, 0), (16, 40), (30, 0), (8, 300), (0, 512)]  # (decodes, prefill tokens)


def _sums(shapes, cost: ForwardCost = COST) -> ForwardCostSums:
    sums = ForwardCostSums()
    for decodes, tokens in shapes:
        sums = sums.add(decodes, tokens, cost.seconds(1, decodes, tokens))
    return sums


def test_the_fit_recovers_a_linear_cost():
    fit = _sums(SHAPES).fit()
    assert fit.fixed_seconds == pytest.approx(COST.fixed_seconds, rel=1e-6)
    assert fit.seconds_per_decode == pytest.approx(COST.seconds_per_decode, rel=1e-6)
    assert fit.seconds_per_prefill_token == pytest.approx(COST.seconds_per_prefill_token, rel=1e-6)


def test_an_engine_that_never_decodes_gets_no_decode_cost():
    prm = ForwardCost(0.035, 0.0, 0.00022)
    fit = _sums([(0, 80), (0, 253), (0, 640), (0, 2048)], prm).fit()
    assert fit.seconds_per_decode == 0.0
    assert fit.fixed_seconds == pytest.approx(prm.fixed_seconds, rel=1e-6)
    assert fit.seconds_per_prefill_token == pytest.approx(prm.seconds_per_prefill_token, rel=1e-6)


def test_too_few_forwards_have_no_fit():
    assert _sums(SHAPES[:2]).fit() is None
    assert widest_forward_seconds(_sums(SHAPES[:2]), width=32, token_budget=2048) is None


def test_sums_subtract_to_the_forwards_of_a_window():
    """A run's share of an engine that outlives it: its forwards' fit alone."""
    before = _sums(SHAPES, ForwardCost(0.5, 0.1, 0.01))
    after = before
    for decodes, tokens in SHAPES:
        after = after.add(decodes, tokens, COST.seconds(1, decodes, tokens))
    assert (after - before).fit().fixed_seconds == pytest.approx(COST.fixed_seconds, rel=1e-6)


def test_widest_forwards_pay_the_fixed_cost_once_per_full_batch():
    """SHAPES hold 75 decodes and 852 prefill tokens in 7 forwards. At width 32 the decodes
    need 75/32 forwards and the tokens 927/2048 of one: 2.34 fixed costs instead of 7; at
    width 100 the token budget is the limit (a budget of 256 tokens: 927/256 forwards)."""
    sums = _sums(SHAPES)
    assert widest_forward_seconds(sums, width=32, token_budget=2048) == pytest.approx(
        COST.seconds(75 / 32, 75, 852), rel=1e-6)
    assert widest_forward_seconds(sums, width=100, token_budget=256) == pytest.approx(
        COST.seconds(927 / 256, 75, 852), rel=1e-6)
    assert widest_forward_seconds(sums, width=32, token_budget=2048) < sums.s


def test_the_engine_times_every_forward(generator_model):
    engine = Engine(generator_model.name, EngineConfig(), loaded=generator_model)
    prompts = [generator_model.tokenizer.encode(text) for text in ("What is 2 + 3?", "Solve x^2 = 9 for x.")]
    engine.generate(prompts, SamplingParams(temperature=0.8, n=4, max_tokens=8, ignore_eos=True))
    stats, sums = engine.stats, engine.stats.forward_costs
    assert sums.n == stats.steps
    assert sums.d == sum(stats.decode_batch_sizes)
    assert sums.d + sums.p == stats.computed_tokens
    # Forwards run one at a time here: their seconds add up to the busy time.
    assert 0.9 * engine.busy.seconds <= sums.s <= engine.busy.seconds + 1e-3
