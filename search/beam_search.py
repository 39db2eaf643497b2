"""PRM-guided beam search (search-and-learn's `_beam_search`; docs/semantics.md lists
where it differs and the switch for each).

Each iteration: refill the survivors to `n` active beams by copying, generate one step per
beam (at the last iteration, with `eos_sampling`, the rest of the solution), PRM-score
every beam, move completed beams aside, drop exact-duplicate texts (optional), keep the
best n // M by aggregated score. Stops after `num_iterations` or when no active beam
remains. The result is the first n completed beams (or the best n, `sort_completed`),
padded to n with copies (`pad_completed`). When no beam completed, search-and-learn fails;
here the survivors are returned and the result says so (`completed_beams == 0`).
"""

from __future__ import annotations

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
        survivors = keep(active, config)
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


def top(beams: list[Beam], k: int, aggregation: str) -> list[Beam]:
    """The k best by aggregated score, best first; ties keep the earlier beam (stable sort)."""
    return sorted(beams, key=lambda beam: beam.score(aggregation), reverse=True)[:k]


def keep(active: list[Beam], config: SearchConfig) -> list[Beam]:
    """The n // M best active beams, in generation order or best first (`survivor_order`)."""
    best = top(active, config.keep, config.aggregation)
    if config.survivor_order == "score":
        return best
    chosen = {id(beam) for beam in best}
    return [beam for beam in active if id(beam) in chosen]


def final_beams(completed: list[Beam], active: list[Beam], config: SearchConfig) -> list[Beam]:
    pool = completed or active
    if config.sort_completed:
        pool = top(pool, len(pool), config.aggregation)
    pool = pool[:config.n]
    if config.pad_completed and completed:
        pool = refill(pool, config.n)
    return pool
