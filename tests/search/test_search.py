"""Beam search, best-of-N and DVTS on the real demo models and real MATH-500 problems.

Runs are tiny (n=4, M=2, 2-3 iterations, a few dozen tokens per step) so the whole file
takes a couple of minutes on two CPU cores. A recording wrapper around the engine-backed
step backend shows what the search asked for at every iteration."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pytest

from search import ScoreCache, SearchConfig, run_search
from search.answers import extract_answer
from search.beam_search import keep, refill, unique_texts
from search.beam_state import Beam, split_steps, step_seed
from search.driver import solve
from search.prompts import encode_text
from search.grading import grade, majority_pick, weighted_pick
from search.problem import Problem
from search.session import SearchSession
from tests.helpers import assert_same_search
from tts_runtime.config import ConfigError
from tts_runtime.runs.datasets import DatasetConfig, load_problems

# eos_sampling off: the last iteration is one more step, so every iteration is comparable
# (tests/test_semantics.py covers the default run to the end).
SMALL = dict(n=4, beam_width=2, num_iterations=2, max_step_tokens=40, max_tokens=48, eos_sampling=False)


@pytest.fixture(scope="module")
def problems(math500_path):
    return load_problems(DatasetConfig(dataset_path=str(math500_path), limit=3))


class Recorder:
    """A `StepBackend` that passes through to the engine and records every call."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.config = inner.config
        self.counts = inner.counts
        self.expanded: list[tuple[list[Beam], int]] = []  # (beams, width) per iteration
        self.children: list[list[list[Beam]]] = []
        self.scored: list[list[Beam]] = []

    def root(self) -> Beam:
        return self.inner.root()

    async def expand(self, beams, iteration, *, width=1, to_eos=False):
        assert iteration == len(self.expanded)
        self.expanded.append((list(beams), width))
        children = await self.inner.expand(beams, iteration, width=width, to_eos=to_eos)
        self.children.append(children)
        return children

    async def score(self, beams) -> None:
        await self.inner.score(beams)
        self.scored.append(list(beams))


def trace(runtime, problem, cache=None, **config):
    """Solve one problem through a Recorder; returns (result, recorder, session)."""
    session = SearchSession(runtime, SearchConfig(**config), cache)
    recorder = Recorder(session.steps_for(problem))

    async def main():
        task = asyncio.ensure_future(solve(recorder, problem))
        await runtime.drive(task)
        return task.result()

    return asyncio.run(main()), recorder, session


# -- configuration ---------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    (dict(n=6, beam_width=4), "multiple of the beam width"),
    (dict(n=0), "n must be >= 1"),
    (dict(num_iterations=0), "num_iterations"),
    (dict(problem_batch=0), "problem batch"),
    (dict(temperature=-1), "temperature"),
    (dict(aggregation="median"), "aggregation"),
    (dict(prm_format="nope"), "unknown PRM format"),
    (dict(method="mcts"), "unknown search method"),
    (dict(method="dvts", n=6, beam_width=4), "multiple of the beam width"),
])
def test_config_rejects_bad_parameters(options, message):
    with pytest.raises(ConfigError, match=message):
        SearchConfig(**options)


def test_best_of_n_ignores_beam_width():
    assert SearchConfig(method="bon", n=6, beam_width=4).n == 6


# -- beams -------------------------------------------------------------------------------

def test_steps_keep_their_delimiter_and_drop_blank_pieces():
    assert split_steps("## Step 1\nx\n\n## Step 2\ny\n\n\n\nThe answer") == [
        "## Step 1\nx\n\n", "## Step 2\ny\n\n", "The answer"]
    assert split_steps("\n\n") == []


def test_child_completion_rules():
    root = Beam([1, 2, 3], 3)
    step = dict(max_len=100)
    assert root.child([7, 8], "Step one\n\n", "stop", **step).finish_reason is None
    assert root.child([7], "Done.", "eos", **step).finish_reason == "eos"
    assert root.child([7] * 10, "runaway", "length", **step).finish_reason == "length"
    assert root.child([7], "\n\n", "stop", **step).finish_reason == "empty"
    # The generator's context is full (vLLM's rule): completed, however the step ended.
    assert root.child([7] * 97, "long\n\n", "stop", **step).finish_reason == "length"
    assert root.child([7] * 96, "long\n\n", "stop", **step).finish_reason is None
    child = root.child([7, 8], "a\n\n", "stop", **step)
    assert child.token_ids == [1, 2, 3, 7, 8] and child.generated_tokens == 2 and root.steps == []


def test_a_childs_step_seed_is_keyed_by_its_whole_token_ids():
    """The child continues its parent's running hash; the seed must be the one its token ids
    alone give (a speculative step and a re-tokenized beam, built fresh, sample the same)."""
    root = Beam(list(range(100, 1100)), 1000)
    root.token_digest()  # the parent's hash is running when its children are made
    step = dict(max_len=5000)
    grandchild = root.child([7, 8], "a\n\n", "stop", **step).child([9] * 300, "b\n\n", "stop", **step)
    fresh = Beam(list(grandchild.token_ids), 1000)
    assert grandchild.token_digest() == fresh.token_digest() != root.token_digest()
    assert step_seed(42, "p", 3, grandchild) == step_seed(42, "p", 3, fresh) != step_seed(42, "p", 3, root)
    sibling = root.child([7, 9], "a\n\n", "stop", **step)  # the parent's hash is copied, not extended
    assert sibling.token_digest() == Beam([*range(100, 1100), 7, 9], 1000).token_digest()
    assert replace(grandchild, token_ids=[1, 2]).token_digest() == Beam([1, 2], 2).token_digest()


# -- beam search -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sampled_beam(search_runtime, problems):
    return trace(search_runtime, problems[0], **{**SMALL, "num_iterations": 3, "max_step_tokens": 48,
                                                   "temperature": 0.8, "seed": 1})


@pytest.mark.slow
def test_beam_search_keeps_n_beams_and_refills_from_the_top(sampled_beam):
    result, rec, _ = sampled_beam
    config = rec.config
    assert len(rec.expanded) >= 2, "the tree should grow past the first step"
    for beams, width in rec.expanded:
        assert len(beams) == config.n and width == 1
    for iteration in range(1, len(rec.expanded)):
        scored = rec.scored[iteration - 1]
        unique: list[Beam] = []
        for beam in scored:
            if not beam.completed and beam.text not in {u.text for u in unique}:
                unique.append(beam)
        best = sorted(unique, key=lambda beam: beam.score("last"), reverse=True)[:config.keep]
        best = [beam for beam in unique if any(beam is b for b in best)]  # in generation order
        assert rec.expanded[iteration][0] == refill(best, config.n)
        assert len({id(beam) for beam in rec.expanded[iteration][0]}) == len(best)


@pytest.mark.slow
def test_beam_search_scores_every_step_and_grows_one_step_per_iteration(sampled_beam):
    _, rec, _ = sampled_beam
    for (parents, _), children in zip(rec.expanded, rec.children):
        for parent, [child] in zip(parents, children):
            assert child.token_ids[:len(parent.token_ids)] == parent.token_ids
            assert child.steps[:len(parent.steps)] == parent.steps
            assert len(child.steps) - len(parent.steps) <= 1
            assert len(child.step_scores) == len(child.steps)
            assert all(0.0 <= s <= 1.0 for s in child.step_scores)
            assert child.step_scores[:-1] == parent.step_scores[:len(child.step_scores) - 1]


@pytest.mark.slow
def test_beam_search_final_pick_is_best_of_the_first_completed(sampled_beam, problems):
    result, rec, _ = sampled_beam
    completed = [beam for scored in rec.scored for beam in scored if beam.completed]
    assert all(beam.finish_reason in ("eos", "length", "empty") for beam in completed)
    assert result.completed_beams == len(completed)
    # The first n to complete (sort_completed off), padded to n; the survivors when none did.
    first = completed[:rec.config.n]
    assert len(result.beams) in ({rec.config.n} if completed else set(range(1, rec.config.keep + 1)))
    assert [b.steps for b in result.beams[:len(first)]] == [b.steps for b in first]
    best = max(result.beams, key=lambda beam: beam.score)
    assert result.score == pytest.approx(best.score)
    assert result.prediction == best.answer == extract_answer(best.text)
    assert result.correct == grade(result.prediction, problems[0].answer)


@pytest.mark.slow
def test_steps_complete_on_their_token_cap(search_runtime, problems):
    result, rec, _ = trace(search_runtime, problems[0], **{**SMALL, "max_step_tokens": 6, "temperature": 0.0})
    assert len(rec.expanded) == 1, "every beam completed at the first step, so the search stops"
    assert [beam.finish_reason for beam in result.beams] == ["length"] * 4
    assert all(beam.tokens == 6 for beam in result.beams)


@pytest.mark.slow
def test_steps_complete_on_eos(search_runtime):
    # SmolLM2 answers this one in a single sentence and stops (greedy).
    probe = Problem("probe/one-plus-one", "What is $1+1$?", "2", 1, None)
    result, rec, _ = trace(search_runtime, probe, **SMALL, temperature=0.0)
    assert len(rec.expanded) == 1
    assert [beam.finish_reason for beam in result.beams] == ["eos"] * 4
    assert all(len(beam.steps) == 1 and beam.tokens < 40 for beam in result.beams)


@pytest.mark.slow
def test_eos_sampling_lets_the_last_iteration_run_past_step_ends(search_runtime, problems):
    # One iteration, so it is the last: no stop at "\n\n", the whole-solution cap applies.
    result, _, _ = trace(search_runtime, problems[0], **{**SMALL, "num_iterations": 1, "max_step_tokens": 8,
                                                          "max_tokens": 40, "eos_sampling": True}, temperature=0.0)
    for beam in result.beams:
        assert beam.finish_reason in ("eos", "length")
        assert beam.tokens == 40 and len(beam.steps) >= 2


@pytest.fixture(scope="module")
def greedy_copies(search_runtime, problems):
    """Greedy decoding: every copy of a beam generates the same step as the original."""
    before = search_runtime.prm.stats.scored_positions
    cache = ScoreCache()
    result, rec, _ = trace(search_runtime, problems[0], cache, **SMALL, temperature=0.0, filter_duplicates=False)
    return result, rec, cache, search_runtime.prm.stats.scored_positions - before


@pytest.mark.slow
def test_duplicates_are_kept_without_the_filter(greedy_copies):
    _, rec, _, _ = greedy_copies
    assert len(rec.expanded) == 2
    second = rec.expanded[1][0]
    assert len({beam.text for beam in second}) == 1
    assert len({id(beam) for beam in second}) == 2  # the top two copies, each refilled twice


@pytest.mark.slow
def test_duplicates_are_dropped_with_the_filter(search_runtime, problems):
    _, rec, _ = trace(search_runtime, problems[0], **SMALL, temperature=0.0, filter_duplicates=True)
    first = rec.scored[0]
    assert len({beam.text for beam in first}) == 1 and len(first) == 4
    second = rec.expanded[1][0]
    assert len(second) == 4 and len({id(beam) for beam in second}) == 1
    assert second[0] is first[0]


@pytest.mark.slow
def test_score_cache_answers_copied_beams(greedy_copies):
    result, rec, cache, prm_requests = greedy_copies
    lookups = sum(len(beam.steps) for scored in rec.scored for beam in scored)
    distinct = {tuple(beam.steps[:k]) for scored in rec.scored for beam in scored
                for k in range(1, len(beam.steps) + 1)}
    assert cache.misses == len(distinct) == prm_requests == result.prm_requests
    assert cache.hits == lookups - len(distinct)
    # Iteration 0: four identical first steps, one PRM request; iteration 1: the copied
    # first step four times plus three copies of the one new second step.
    assert (cache.hits, cache.misses) == (3 + 4 + 3, 2)


# -- continuous problem batching ---------------------------------------------------------

@pytest.fixture(scope="module")
def batched_runs(search_runtime, problems):
    runs = {}
    for batch in (1, 2):
        engine = search_runtime.generator.stats
        start = len(engine.decode_batch_sizes)
        cache, finished = ScoreCache(), []
        config = SearchConfig(**SMALL, temperature=0.0, filter_duplicates=False, problem_batch=batch)
        results = run_search(search_runtime, problems[:2], config, cache=cache, on_result=finished.append)
        runs[batch] = (results, engine.decode_batch_sizes[start:], cache, finished)
    return runs


@pytest.mark.slow
def test_problem_batching_fills_the_generator_batches(batched_runs):
    one, two = batched_runs[1][1], batched_runs[2][1]
    assert max(one) <= 4  # one problem: its 4 beams at most
    assert max(two) == 8  # two problems decode together
    assert sum(two) / len(two) > 1.5 * sum(one) / len(one)
    assert len(two) < len(one)


@pytest.mark.slow
def test_problem_results_do_not_depend_on_batch_company(batched_runs, problems):
    alone, together = batched_runs[1][0], batched_runs[2][0]
    assert [r.id for r in alone] == [p.id for p in problems[:2]]
    assert_same_search(alone, together)


@pytest.mark.slow
def test_driver_reports_each_problem_and_frees_its_cache(batched_runs):
    for results, _, cache, finished in batched_runs.values():
        assert sorted(r.id for r in finished) == sorted(r.id for r in results)
        assert len(cache) == 0
        assert all(r.seconds > 0 and r.generated_tokens > 0 and r.iterations >= 1 for r in results)


# -- best-of-N and DVTS ------------------------------------------------------------------

@pytest.mark.slow
def test_best_of_n_scores_every_step_of_n_samples(search_runtime, problems):
    result, rec, session = trace(search_runtime, problems[1], method="bon", n=4, max_tokens=48,
                                 temperature=0.8)
    [(roots, width)] = rec.expanded
    assert len(roots) == 1 and width == 4 and not roots[0].steps
    samples = rec.children[0][0]
    assert len(result.beams) == 4
    assert len({beam.text for beam in samples}) > 1, "seeded samples differ from each other"
    for beam, record in zip(samples, result.beams):
        assert record.steps == beam.steps == split_steps(beam.text)
        assert len(record.step_scores) == len(record.steps)
        assert record.finish_reason in ("eos", "length")
        assert record.tokens <= 48
    best = max(result.beams, key=lambda b: b.score)
    assert result.prediction == best.answer and math.isclose(result.score, best.score)
    candidates = [(b.answer, b.score) for b in result.beams]
    assert result.weighted_prediction == weighted_pick(candidates)
    assert result.majority_prediction == majority_pick(candidates)


@pytest.mark.slow
def test_dvts_grows_independent_subtrees(search_runtime, problems):
    result, rec, _ = trace(search_runtime, problems[1], method="dvts", **SMALL, temperature=0.8)
    keep, width = rec.config.keep, rec.config.beam_width
    heads, first_width = rec.expanded[0]
    assert len(heads) == keep and first_width == width and heads[0] is heads[1]
    for iteration in range(1, len(rec.expanded)):
        candidates = rec.children[iteration - 1]
        expected = [max(group, key=lambda b: b.score("last")) for group in candidates]
        assert rec.expanded[iteration][0] == [head for head in expected if not head.completed]
        for head, group in zip(rec.expanded[iteration][0], rec.children[iteration]):
            assert len(group) == width
            assert all(child.steps[:len(head.steps)] == head.steps for child in group)
    # The leaves: each subtree's last M candidates, its chosen head among them.
    assert len(result.beams) == rec.config.n
    candidates = [beam.steps for groups in rec.children for group in groups for beam in group]
    assert all(leaf.steps in candidates for leaf in result.beams)
    assert {tuple(group[0].steps[:-1]) for group in rec.children[-1]} <= {
        tuple(leaf.steps[:-1]) for leaf in result.beams}


# -- the plain baseline ------------------------------------------------------------------

@pytest.mark.slow
def test_hf_baseline_makes_the_same_greedy_search(search_runtime, problems):
    from evals.baselines import HFModels, run_baseline

    config = SearchConfig(**SMALL, temperature=0.0)
    ours = run_search(search_runtime, problems[:1], config)
    plain = run_baseline(HFModels.load("smollm2-135m-instruct", "gemma3-270m"), problems[:1], config)
    for a, b in zip(ours, plain):
        assert [beam.steps for beam in a.beams] == [beam.steps for beam in b.beams]
        for x, y in zip(a.beams, b.beams):
            assert x.step_scores == pytest.approx(y.step_scores, abs=1e-4)
        assert a.generated_tokens == b.generated_tokens
        assert b.prm_tokens > a.prm_tokens  # no score cache, no dedupe of copies


# -- search-and-learn switches on the real models (docs/semantics.md) ----------------------

class LookaheadRecorder(Recorder):
    """A Recorder that also records the greedy rollouts of `lookahead` (same iteration)."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.rollouts: list[tuple[int, list[Beam], list[Beam]]] = []  # (iteration, parents, children)

    async def expand(self, beams, iteration, *, width=1, to_eos=False, greedy=False):
        if not greedy:
            return await super().expand(beams, iteration, width=width, to_eos=to_eos)
        children = await self.inner.expand(beams, iteration, width=width, to_eos=to_eos, greedy=True)
        self.rollouts.append((iteration, list(beams), [child for [child] in children]))
        return children


def trace_lookahead(runtime, problem, **config):
    session = SearchSession(runtime, SearchConfig(**config))
    recorder = LookaheadRecorder(session.steps_for(problem))

    async def main():
        task = asyncio.ensure_future(solve(recorder, problem))
        await runtime.drive(task)
        return task.result()

    return asyncio.run(main()), recorder, session


def _drive(runtime, coroutine):
    """Run one backend call to its end, the runtime stepping the engines meanwhile."""
    async def main():
        task = asyncio.ensure_future(coroutine)
        await runtime.drive(task)
        return task.result()

    return asyncio.run(main())


SAMPLED = {**SMALL, "temperature": 0.8, "seed": 1}


@pytest.fixture(scope="module")
def empty_step_run(search_runtime, problems):
    return trace(search_runtime, problems[0], **SAMPLED, prm_format="rlhflow", sal_empty_step=True)


def _hf_scores(model, query_ids: list[int], positions: list[int], candidates) -> list[float]:
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([query_ids])).logits[0].float()
    return [logits[p, list(candidates)].softmax(dim=-1)[0].item() for p in positions]


@pytest.mark.slow
def test_empty_step_scores_rank_the_beams_under_the_switch(empty_step_run, prm_model, hf_reference, problems):
    _, rec, session = empty_step_run
    fmt, question = session.prm_format, problems[0].question
    ends = [beam for scored in rec.scored for beam in scored if beam.text.endswith("\n\n")]
    assert ends, "mid-search beams end in the step delimiter"
    for scored in rec.scored:
        for beam in scored:
            extra = 1 if beam.text.endswith("\n\n") else 0
            assert len(beam.step_scores) == len(beam.steps) + extra
    # The extra score is the PRM's verdict on an empty step after the beam, computed here
    # independently (HF transformers on that query).
    beam = ends[-1]
    query = fmt.build(question, [*beam.steps, ""])
    [expected] = _hf_scores(hf_reference(prm_model), query.token_ids, list(query.positions), query.candidate_token_ids)
    assert beam.step_scores[-1] == pytest.approx(expected, abs=1e-4)
    # Ranked by it ("last" aggregation): the survivors are the best by the empty step's score.
    assert len(rec.expanded) > 1
    for iteration in range(1, len(rec.expanded)):
        unique = unique_texts([b for b in rec.scored[iteration - 1] if not b.completed])
        best = sorted(unique, key=lambda b: b.step_scores[-1], reverse=True)[:rec.config.keep]
        assert set(map(id, rec.expanded[iteration][0])) == set(map(id, best))


@pytest.mark.slow
def test_per_prefix_scores_equal_one_whole_text_pass(empty_step_run, prm_model, hf_reference, problems):
    """search-and-learn scores a beam in one forward pass over its whole text, reading each
    step at its position; tts sends one query per step prefix (cache and prefix reuse). For a
    causal PRM and a format whose shorter queries are prefixes of the longer, they agree."""
    _, rec, session = empty_step_run
    fmt, question = session.prm_format, problems[0].question
    # The generated first step and two more written out, scored as the search scores a beam.
    first = rec.scored[0][0].steps[0]
    beam = Beam([0], 1, [first, "So $r = \\sqrt{0^2 + 3^2} = 3$.\n\n", "The angle is $\\frac{\\pi}{2}$.\n\n"])
    _drive(session.runtime, session.steps_for(problems[0]).score([beam]))
    prefixes = [beam.steps[:k] for k in range(1, len(beam.steps) + 1)] + [[*beam.steps, ""]]
    assert len(beam.step_scores) == len(prefixes) == 4
    whole = fmt.build(question, prefixes[-1]).token_ids
    positions = []
    for prefix in prefixes:
        query = fmt.build(question, prefix)
        assert whole[:len(query.token_ids)] == query.token_ids
        positions.append(query.positions[0])
    one_pass = _hf_scores(hf_reference(prm_model), whole, positions, fmt.candidate_token_ids)
    assert beam.step_scores == pytest.approx(one_pass, abs=1e-4)


@pytest.mark.slow
def test_lookahead_ranks_by_greedy_rollouts(search_runtime, problems):
    result, rec, session = trace_lookahead(search_runtime, problems[0], **SAMPLED, lookahead=1)
    config = rec.config
    assert rec.rollouts and all(iteration < config.num_iterations - 1 for iteration, _, _ in rec.rollouts)
    greedy = SearchSession(search_runtime, SearchConfig(**{**SAMPLED, "temperature": 0.0})).steps_for(problems[0])
    for iteration, parents, children in rec.rollouts:
        assert len(rec.expanded) > iteration + 1
        # One more step each, decoded greedily: what a temperature-0 search would generate.
        again = _drive(search_runtime, greedy.expand(parents, iteration))
        assert [child.steps for child in children] == [c.steps for [c] in again]
        assert all(len(c.steps) - len(p.steps) <= 1 and c.steps[:len(p.steps)] == p.steps
                   for p, c in zip(parents, children))
        # The survivors are the best rollouts' parents, which keep only their own steps.
        ranks = [child.score("last") for child in children]
        best = sorted(range(len(parents)), key=lambda i: ranks[i], reverse=True)[:config.keep]
        assert set(map(id, rec.expanded[iteration + 1][0])) == {id(parents[i]) for i in best}
    _, unused, _ = trace_lookahead(search_runtime, problems[0], **SAMPLED, lookahead=1, sal_lookahead_unused=True)
    assert not unused.rollouts  # search-and-learn's beam search never ranks by its rollouts
    if len(unused.expanded) > 1:  # ranked by the beams' own scores, as with lookahead 0
        active = unique_texts([b for b in unused.scored[0] if not b.completed])
        assert unused.expanded[1][0] == refill(keep(active, unused.config), config.n)


@pytest.mark.slow
def test_uneven_n_prunes_nothing_when_n_is_below_the_beam_width(search_runtime, problems):
    _, rec, _ = trace(search_runtime, problems[0], **{**SAMPLED, "n": 3, "beam_width": 4}, sal_uneven_n=True)
    assert len(rec.expanded) >= 2
    for iteration in range(len(rec.expanded)):
        assert len(rec.expanded[iteration][0]) == 3
        if iteration:
            unique = unique_texts([b for b in rec.scored[iteration - 1] if not b.completed])
            assert rec.expanded[iteration][0] == refill(unique, 3)  # all kept, in order


def test_step_cap_is_clipped_to_the_room_left(search_runtime, problems):
    steps = SearchSession(search_runtime, SearchConfig(**SMALL)).steps_for(problems[0])
    room = search_runtime.generator.max_model_len
    root = steps.root()
    assert steps._params(root, 0, 1, False).max_tokens == SMALL["max_step_tokens"]
    assert steps._params(root, 0, 1, True).max_tokens == SMALL["max_tokens"]
    near_end = Beam(root.token_ids + [root.token_ids[-1]] * (room - len(root.token_ids) - 5), root.prompt_len)
    assert steps._params(near_end, 0, 1, False).max_tokens == 5
    assert steps._params(near_end, 0, 1, True).max_tokens == 5


def test_sal_retokenize_continues_a_beam_from_its_text_encoded_whole(search_runtime, problems):
    """search-and-learn sends vLLM each beam's rendered text: a step sampled as "\n", "\n"
    is continued from the one "\n\n" token the text encodes to (docs/semantics.md row 33);
    tts continues from the sampled tokens unless `sal_retokenize`."""
    tokenizer = search_runtime.generator.tokenizer

    def child_of_sampled_step(**switch):
        session = SearchSession(search_runtime, SearchConfig(temperature=0, max_step_tokens=4, **switch))
        steps = session.steps_for(problems[0])
        root = steps.root()
        sampled = root.token_ids + encode_text(tokenizer, "Add them.") + encode_text(tokenizer, "\n") * 2
        beam = Beam(sampled, root.prompt_len, ["Add them.\n\n"], [0.5])

        async def main():
            task = asyncio.ensure_future(steps.expand([beam], 1))
            await search_runtime.drive(task)
            return task.result()

        [[child]] = asyncio.run(main())
        return session, sampled, child

    _, sampled, child = child_of_sampled_step()
    assert child.token_ids[:len(sampled)] == sampled
    session, sampled, child = child_of_sampled_step(sal_retokenize=True)
    whole = session.prompts.continuation_token_ids(problems[0].question, "Add them.\n\n")
    assert whole != sampled and whole[-1:] == encode_text(tokenizer, "\n\n")
    assert child.token_ids[:len(whole)] == whole
    assert child.steps[0] == "Add them.\n\n" and child.prompt_len == len(session.prompts.prompt_token_ids(
        problems[0].question))


def test_sal_retokenize_refuses_speculative_extension(search_runtime):
    with pytest.raises(ConfigError, match="sal_retokenize") as info:
        SearchSession(search_runtime, SearchConfig(sal_exact=True, speculative_extension=True))
    assert "\n" not in str(info.value)
