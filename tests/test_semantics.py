"""One test per row of docs/semantics.md that no other test file covers: where tts and
search-and-learn differ, and the switch that gives each behaviour.

The beam-search rules are pure functions over beams, tested here on hand-built beams;
the model-backed rows (the last iteration's run to the end, step caps, the PRM layouts)
are tested in test_search.py and test_prompts_prm.py on the real demo models."""

from __future__ import annotations

from dataclasses import replace

import random

import numpy as np
import pytest

from search.beam_search import final_beams, keep, refill
from search.beam_state import Beam, StepCounts
from search.config import SAL_SWITCHES, SearchConfig
from search.problem import Problem
from search.results import summarize
from tts_runtime.config import ConfigError


def _beam(text: str, score: float, finish: str | None = None) -> Beam:
    return Beam([0], 1, [text], [score], finish)


def test_defaults_follow_the_beam_search_recipe():
    config = SearchConfig()
    assert (config.n, config.beam_width, config.num_iterations) == (4, 4, 40)
    assert (config.temperature, config.top_p) == (0.8, 1.0)
    assert (config.max_step_tokens, config.max_tokens) == (2048, 2048)
    assert config.aggregation == "last"
    assert config.filter_duplicates and not config.sort_completed
    assert config.eos_sampling and config.pad_completed
    assert config.survivor_order == "original"
    assert (config.vote_aggregation, config.vote_ties) == ("last", "first")


def test_completed_beams_are_the_first_n_padded_with_copies():
    done = [_beam("a", 0.1, "eos"), _beam("b", 0.9, "eos"), _beam("c", 0.5, "eos")]
    config = SearchConfig(n=2, beam_width=2)
    assert final_beams(done, [], config) == done[:2]  # the first two to complete
    sorted_config = SearchConfig(n=2, beam_width=2, sort_completed=True)
    assert final_beams(done, [], sorted_config) == [done[1], done[2]]  # the best two
    few = SearchConfig(n=4, beam_width=2)
    assert final_beams(done[:1], [], few) == [done[0]] * 4  # padded by copies
    unpadded = SearchConfig(n=4, beam_width=2, pad_completed=False)
    assert final_beams(done[:1], [], unpadded) == [done[0]]


def test_no_completed_beam_returns_the_survivors_and_says_so():
    survivors = [_beam("x", 0.3), _beam("y", 0.7)]
    config = SearchConfig(n=4, beam_width=2)
    beams = final_beams([], survivors, config)
    assert beams == survivors  # not padded, not a crash
    result = summarize(Problem("p", "q", "1", 1, None), beams, config, StepCounts(completed_beams=0), 1.0)
    assert result.completed_beams == 0
    assert [beam.finish_reason for beam in result.beams] == [None, None]


def test_survivors_keep_generation_order_or_go_best_first():
    active = [_beam("a", 0.2), _beam("b", 0.9), _beam("c", 0.5), _beam("d", 0.1)]
    original = SearchConfig(n=4, beam_width=2)
    assert keep(active, original) == [active[1], active[2]]  # b, c as generated
    assert keep(active, SearchConfig(n=4, beam_width=2, survivor_order="original")) == [active[1], active[2]]
    by_score = SearchConfig(n=4, beam_width=2, survivor_order="score")
    assert keep([active[2], active[1]], by_score) == [active[1], active[2]]
    assert keep([active[2], active[1]], original) == [active[2], active[1]]
    # Refilling cycles through the survivors in that order, as (beams * repeats)[:n] does.
    assert refill([active[2], active[1]], 4) == [active[2], active[1], active[2], active[1]]


def test_votes_weigh_last_step_scores_whatever_the_ranking_aggregation():
    # search-and-learn's score.py weighs every candidate by its last step's score. Here 7
    # gets 0.2 + 0.35 against 0.5 for 9; weighed by `min`, 7 would get 0.2 + 0.1.
    beams = [Beam([0], 1, ["so \\boxed{7}"], [0.9, 0.2], "eos"),
             Beam([0], 1, ["\\boxed{9}"], [0.5, 0.5], "eos"),
             Beam([0], 1, ["thus \\boxed{7}"], [0.1, 0.35], "eos")]
    problem = Problem("p", "q", "7", 1, None)
    result = summarize(problem, beams, SearchConfig(aggregation="min"), StepCounts(completed_beams=3), 1.0)
    assert result.prediction == "9" and result.score == 0.5  # ranked by min: 0.2, 0.5, 0.1
    assert result.weighted_prediction == "7" and result.weighted_correct
    assert result.majority_prediction == "7"
    assert not result.correct and result.majority_correct  # graded once per distinct answer, each its own
    by_min = summarize(problem, beams, SearchConfig(aggregation="min", vote_aggregation="min"), StepCounts(), 1.0)
    assert by_min.weighted_prediction == "9"


# -- search-and-learn switches (sal_exact and one sal_* field per difference) ------------

def test_sal_exact_turns_every_switch_on_and_each_can_be_set_alone():
    plain = SearchConfig().resolved()
    assert not any(getattr(plain, name) for name in SAL_SWITCHES) and plain.seed == 42
    exact = SearchConfig(sal_exact=True).resolved()
    assert all(getattr(exact, name) is True for name in SAL_SWITCHES)
    assert exact.seed == 0  # every search-and-learn recipe's seed
    assert SearchConfig(sal_exact=True, seed=7).resolved().seed == 7  # a given seed wins
    assert SearchConfig(sal_exact=True, sal_tie_order=False).resolved().sal_tie_order is False
    only_ties = SearchConfig(sal_tie_order=True).resolved()
    assert only_ties.sal_tie_order and not only_ties.sal_empty_step and only_ties.seed == 42
    # The fields keep what was given: turned on later (a command-line --sal-exact over a
    # config file), sal_exact still reaches every switch left unset.
    later = replace(SearchConfig(sal_tie_order=False), sal_exact=True).resolved()
    assert later.sal_empty_step and not later.sal_tie_order and later.seed == 0


def _sal_cut(scores: list[float], k: int) -> list[int]:
    """search-and-learn's survivor rule, written out: the indices not pruned after
    `np.argsort(np.array(agg_scores).flatten())[-k:]`, in generation order."""
    top_indices = np.argsort(np.array(scores).flatten())[-k:]
    return [i for i in range(len(scores)) if i in top_indices]


def test_tie_order_is_numpys_argsort_under_the_switch():
    active = [_beam("a", 0.5), _beam("b", 0.9), _beam("c", 0.5), _beam("d", 0.5)]
    # Keep 2 of (0.5, 0.9, 0.5, 0.5): tts keeps the earlier 0.5 (a), numpy's order the last (d).
    assert keep(active, SearchConfig(n=4, beam_width=2)) == [active[0], active[1]]
    assert keep(active, SearchConfig(n=4, beam_width=2, sal_tie_order=True)) == [active[1], active[3]]
    by_score = SearchConfig(n=4, beam_width=2, sal_tie_order=True, survivor_order="score")
    assert keep(active, by_score) == [active[1], active[3]]
    # Against numpy itself, on lists short (insertion sort) and long (numpy's quicksort) with
    # many ties, for every cut size.
    rng = random.Random(0)
    for size in (2, 3, 5, 8, 16, 17, 40, 64, 200):
        scores = [rng.choice([0.1, 0.25, 0.5, 0.75]) for _ in range(size)]
        beams = [_beam(str(i), score) for i, score in enumerate(scores)]
        for k in {1, 2, size // 3 or 1, size // 2 or 1, size}:
            config = SearchConfig(n=k * 2, beam_width=2, sal_tie_order=True)
            assert [int(b.text) for b in keep(beams, config)] == _sal_cut(scores, k), (size, k)


def test_n_not_a_multiple_of_the_beam_width_needs_the_switch():
    with pytest.raises(ConfigError, match=r"n \(6\) must be a multiple of the beam width \(4\)"):
        SearchConfig(n=6, beam_width=4)
    with pytest.raises(ConfigError, match="multiple of the beam width"):  # search-and-learn refuses it for DVTS too
        SearchConfig(method="dvts", n=6, beam_width=4, sal_exact=True)
    active = [_beam(c, s) for c, s in zip("abcde", (0.2, 0.9, 0.5, 0.1, 0.7))]
    six = SearchConfig(n=6, beam_width=4, sal_uneven_n=True)
    assert six.keep == 1 and keep(active, six) == [active[1]]  # 6 // 4 beams survive
    three = SearchConfig(n=3, beam_width=4, sal_uneven_n=True)
    # 3 // 4 == 0 and search-and-learn's argsort(...)[-0:] is the whole list: nothing is pruned.
    assert three.keep == 0 and keep(active[:3], three) == active[:3]
    assert _sal_cut([0.2, 0.9, 0.5], 0) == [0, 1, 2]


def test_lookahead_ranks_by_the_rollout_score_when_given():
    active = [_beam("a", 0.9), _beam("b", 0.1), _beam("c", 0.5)]
    config = SearchConfig(n=2, beam_width=2)
    assert keep(active, config) == [active[0]]
    assert keep(active, config, ranks=[0.2, 0.8, 0.3]) == [active[1]]  # the rollouts' scores decide
    with pytest.raises(ConfigError, match="lookahead applies to beam search only"):
        SearchConfig(method="dvts", lookahead=1)
    with pytest.raises(ConfigError, match="lookahead must be >= 0"):
        SearchConfig(lookahead=-1)
    with pytest.raises(ConfigError, match="do not combine"):
        SearchConfig(lookahead=1, speculative_extension=True)


def test_child_drops_the_empty_step_score_of_its_parent():
    parent = Beam([0], 1, ["x\n\n"], [0.4, 0.8])  # under sal_empty_step: step, then empty step
    child = parent.child([5], "y\n\n", None, max_len=100)
    assert child.steps == ["x\n\n", "y\n\n"] and child.step_scores == [0.4]  # rescored in full next
