"""PRM-guided beam search (search-and-learn's `_beam_search`; docs/semantics.md lists
where it differs and the switch for each).

Each iteration: refill the survivors to `n` active beams by copying, generate one step per
beam (at the last iteration, with `eos_sampling`, the rest of the solution), PRM-score
every beam, move completed beams aside, drop exact-duplicate texts (optional), keep the
best n // M by aggregated score (with `lookahead`, by the score of a greedy rollout of
a few more steps). Stops after `num_iterations` or when no active beam
remains. The result is the first n completed beams (or the best n, `sort_completed`),
padded to n with copies (`pad_completed`). When no beam completed, search-and-learn fails;
here the survivors are returned and the result says so (`completed_beams == 0`).
"""

from __future__ import annotations

import numpy as np

from search.beam_state import Beam, StepBackend
from search.config import SearchConfig


async def beam_search(steps: StepBackend) -> list[Beam]:
    config = steps.config
    survivors = [steps.root()]
    completed: list[Beam] = []
    for iteration in range(config.num_iterations):
        steps.counts.iterations = iteration + 1
        active = refill(survivors, config.n)
        last = iteration == config.num_iterations - 1
        expanded = await steps.expand(active, iteration, to_eos=last and config.eos_sampling)
        active = [children[0] for children in expanded]
        await steps.score(active)
        completed += [beam for beam in active if beam.completed]
        active = [beam for beam in active if not beam.completed]
        if not active:
            break
        if config.filter_duplicates:
            active = unique_texts(active)
        ranks = None
        if config.lookahead and not last and not config.sal_lookahead_unused:
            ranks = await lookahead_scores(steps, active, iteration)
        survivors = keep(active, config, ranks)
    steps.counts.completed_beams = len(completed)
    return final_beams(completed, survivors, config)


def refill(survivors: list[Beam], n: int) -> list[Beam]:
    """n beams cycling through the survivors. Copies share the survivor object: beams are
    never mutated after scoring, and each copy's next step makes a new child."""
    return [survivors[i % len(survivors)] for i in range(n)]


def unique_texts(beams: list[Beam]) -> list[Beam]:
    """The first beam of each distinct text, in order."""
    first: dict[str, Beam] = {}
    for beam in beams:
        first.setdefault(beam.text, beam)
    return list(first.values())


async def lookahead_scores(steps: StepBackend, active: list[Beam], iteration: int) -> list[float]:
    """Each beam's rank under `lookahead`: the aggregated score of its greedy continuation by
    up to `lookahead` steps (fewer where the rollout completes), as search-and-learn's
    `generate_k_steps` rolls out (the first step as sampled, the rest at temperature 0)."""
    config = steps.config
    rollouts = list(active)
    for _ in range(config.lookahead):
        growing = [i for i, beam in enumerate(rollouts) if not beam.completed]
        if not growing:
            break
        expanded = await steps.expand([rollouts[i] for i in growing], iteration, greedy=True)
        for i, [child] in zip(growing, expanded):
            rollouts[i] = child
        await steps.score([rollouts[i] for i in growing])
    return [beam.score(config.aggregation) for beam in rollouts]


def top(beams: list[Beam], k: int, scores: list[float]) -> list[Beam]:
    """The k best by `scores` (one per beam), best first; ties keep the earlier beam (stable sort)."""
    order = sorted(range(len(beams)), key=lambda i: scores[i], reverse=True)
    return [beams[i] for i in order[:k]]


def numpy_top(beams: list[Beam], k: int, scores: list[float]) -> list[Beam]:
    """search-and-learn's cut, `np.argsort(scores)[-k:]`, best first. numpy promises no order
    for equal scores (its sort depends on the array size and the CPU's SIMD sort), so this
    calls numpy itself; where equal scores come out in index order, the later beam wins."""
    order = np.argsort(np.array(scores, dtype=np.float64))[-k:][::-1]
    return [beams[i] for i in order.tolist()]


def keep(active: list[Beam], config: SearchConfig, ranks: list[float] | None = None) -> list[Beam]:
    """The n // M best active beams (by `ranks`, else aggregated score), in generation order
    or best first (`survivor_order`). n // M is 0 only under `sal_uneven_n` (n < M): then, as
    `argsort(...)[-0:]` is the whole list in search-and-learn, every beam is kept."""
    scores = ranks if ranks is not None else [beam.score(config.aggregation) for beam in active]
    cut = numpy_top if config.sal_tie_order else top
    best = cut(active, config.keep or len(active), scores)
    if config.survivor_order == "score":
        return best
    chosen = {id(beam) for beam in best}
    return [beam for beam in active if id(beam) in chosen]


def final_beams(completed: list[Beam], active: list[Beam], config: SearchConfig) -> list[Beam]:
    pool = completed or active
    if config.sort_completed:
        pool = top(pool, len(pool), [beam.score(config.aggregation) for beam in pool])
    pool = pool[:config.n]
    if config.pad_completed and completed:
        pool = refill(pool, config.n)
    return pool
