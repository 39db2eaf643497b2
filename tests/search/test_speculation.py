"""Speculative beam extension (search/speculation.py) on the real demo models and real
MATH-500 problems: the search decides exactly as without it (greedy and seeded sampling),
every speculative token is accounted kept or discarded, and no block stays held.
Plus the two engine pieces it stands on: `first_child` seeds and `abort_request`."""

from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from search import ProblemResult, SearchConfig, run_search
from tts_runtime.cli import app
from tts_runtime.config import ConfigError
from tts_runtime.engine.request import SamplingParams
from tts_runtime.runs.datasets import DatasetConfig, load_problems

# n=4, M=2: two survivors, two copies each; three iterations, the last runs to the end
# (eos_sampling, max_tokens 48), so speculation covers steps and the run to the end.
TINY = dict(method="beam", n=4, beam_width=2, num_iterations=3, max_step_tokens=48, max_tokens=48,
            problem_batch=2)


@pytest.fixture(scope="module")
def problems(math500_path):
    return load_problems(DatasetConfig(dataset_path=str(math500_path), limit=1))


@pytest.fixture(scope="module")
def searched(search_runtime, problems):
    """Run a search once per setting: results and the generator tokens the engine produced."""
    memo: dict[tuple, tuple[list[ProblemResult], int]] = {}

    def get(**options) -> tuple[list[ProblemResult], int]:
        key = tuple(sorted(options.items()))
        if key not in memo:
            before = search_runtime.generator.stats.generated_tokens
            results = run_search(search_runtime, problems, SearchConfig(**{**TINY, **options}))
            memo[key] = results, search_runtime.generator.stats.generated_tokens - before
            assert_idle(search_runtime)
        return memo[key]
    return get


def assert_same_decisions(on: list[ProblemResult], off: list[ProblemResult]) -> None:
    """The same beams, texts and answers; scores equal up to the last float bits (the PRM's
    batches differ, and batched matmuls sum in another order: as tests/search/test_search.py)."""
    def chosen(results):
        return [(r.id, r.prediction, r.iterations, r.completed_beams,
                 [(b.steps, b.finish_reason, b.tokens) for b in r.beams]) for r in results]

    assert chosen(on) == chosen(off)
    for a, b in zip(on, off):
        assert a.score == pytest.approx(b.score, rel=1e-5)
        for x, y in zip(a.beams, b.beams):
            assert x.step_scores == pytest.approx(y.step_scores, rel=1e-5)


def assert_extra_work_is_discarded_speculation(off: list[ProblemResult], off_tokens: int,
                                               on: list[ProblemResult], on_tokens: int) -> None:
    """Kept speculation replaces generation; the engine's extra work is the discarded tokens.
    The engine also counts each sampled EOS, which outputs drop: the same ones on and off for
    the search's steps, plus at most one per discarded speculation (one per beam and iteration)."""
    eos_off = off_tokens - sum(r.generated_tokens for r in off)
    extra = on_tokens - eos_off - sum(r.generated_tokens + r.speculative_discarded_tokens for r in on)
    assert 0 <= eos_off <= TINY["n"] * TINY["num_iterations"] * len(off)
    assert 0 <= extra <= TINY["n"] * TINY["num_iterations"] * len(on)


def assert_idle(runtime) -> None:
    """Nothing left generating or holding blocks (freed blocks may stay cached)."""
    assert not runtime.busy
    assert runtime.generator.block_counts().in_use == 0
    assert runtime.prm.block_counts().in_use == 0


TEMPERATURES = pytest.mark.parametrize("temperature", [0.0, 0.8], ids=["greedy", "sampled"])


@pytest.mark.slow
@TEMPERATURES
def test_speculation_makes_the_same_search(searched, temperature):
    off, _ = searched(temperature=temperature)
    on, _ = searched(temperature=temperature, speculative_extension=True)
    assert_same_decisions(on, off)
    assert [r.generated_tokens for r in on] == [r.generated_tokens for r in off]


@pytest.mark.slow
@TEMPERATURES
def test_speculative_tokens_are_kept_or_discarded(searched, temperature):
    off, off_tokens = searched(temperature=temperature)
    on, on_tokens = searched(temperature=temperature, speculative_extension=True)
    assert all(r.speculative_tokens == 0 for r in off)
    for r in on:
        assert r.speculative_kept_tokens > 0
        assert r.speculative_kept_tokens + r.speculative_discarded_tokens == r.speculative_tokens
    assert_extra_work_is_discarded_speculation(off, off_tokens, on, on_tokens)


@pytest.mark.slow
def test_a_token_cap_discards_cut_speculation_and_decides_the_same(searched):
    off, _ = searched(temperature=0.8)
    on, tokens = searched(temperature=0.8, speculative_extension=True, speculative_max_tokens=4)
    assert_same_decisions(on, off)
    assert_extra_work_is_discarded_speculation(off, searched(temperature=0.8)[1], on, tokens)
    # Most steps are longer than 4 tokens: their speculations are cut short and discarded.
    assert sum(r.speculative_discarded_tokens for r in on) > 0


@pytest.mark.parametrize("options, message", [
    (dict(method="dvts", speculative_extension=True), "beam search only"),
    (dict(speculative_max_tokens=0), "speculative_max_tokens must be >= 1"),
])
def test_config_rejects_bad_speculation(options, message):
    with pytest.raises(ConfigError, match=message):
        SearchConfig(**options)


def test_first_child_seeds_continue_a_requests_children(search_runtime):
    engine = search_runtime.generator
    prompt = engine.tokenize("The first three prime numbers are")
    params = SamplingParams(temperature=0.8, seed=7, max_tokens=12)
    [whole] = engine.generate([prompt], replace(params, n=3))
    [third] = engine.generate([prompt], replace(params, first_child=2))
    assert third.completions[0].token_ids == whole.completions[2].token_ids


def test_abort_frees_blocks_and_returns_nothing(search_runtime):
    engine = search_runtime.generator
    prompt = engine.tokenize("Count from one to one hundred: one, two, three,")
    engine.add_request("kept", prompt, SamplingParams(temperature=0.0, max_tokens=6))
    engine.add_request("dropped", prompt, SamplingParams(temperature=0.0, max_tokens=200, n=2))
    for _ in range(3):
        engine.step()
    assert engine.abort_request("dropped") == 6  # two children, a token per step each (prefill samples one)
    assert engine.abort_request("dropped") == 0
    outputs = engine.run_until_done()
    assert [o.request_id for o in outputs] == ["kept"]
    assert engine.block_counts().in_use == 0


def test_cli_refuses_speculation_outside_beam_search(math500_path):
    result = CliRunner().invoke(app, ["dvts", "--dataset-path", str(math500_path), "--limit", "1",
                                      "--speculative-extension"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and "beam search only" in lines[0]
