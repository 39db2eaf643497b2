"""One test per row of docs/semantics.md that no other test file covers: where tts and
search-and-learn differ, and the switch that gives each behaviour.

The beam-search rules are pure functions over beams, tested here on hand-built beams;
the model-backed rows (the last iteration's run to the end, step caps, the PRM layouts)
are tested in test_search.py and test_prompts_prm.py on the real demo models."""

from __future__ import annotations

from search.beam_search import final_beams, keep, refill
from search.beam_state import Beam, StepCounts
from search.config import SearchConfig
from search.problem import Problem
from search.results import summarize


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
    by_min = summarize(problem, beams, SearchConfig(aggregation="min", vote_aggregation="min"), StepCounts(), 1.0)
    assert by_min.weighted_prediction == "9"
