"""PRM-guided beam search (search-and-learn's `_beam_search`, with its gaps fixed).

Each iteration: refill the survivors to `n` active beams by copying, generate one step per
beam, PRM-score every beam, move completed beams aside, drop exact-duplicate texts
(optional), keep the best n // M by aggregated score. Stops after `num_iterations` or when
no active beam remains.

Fixed against search-and-learn: when no beam completed, the active beams are returned
instead of dividing by zero; the kept completed beams are not padded to n with copies
(copies would add weight to one answer in the votes).
"""

from __future__ import annotations

from search.beams import Beam, StepBackend


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
        survivors = top(active, config.keep, config.aggregation)
    return final_beams(completed, survivors, config.n, config.aggregation, config.sort_completed)


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
    """The k best by aggregated score; ties keep the earlier beam (stable sort)."""
    return sorted(beams, key=lambda beam: beam.score(aggregation), reverse=True)[:k]


def final_beams(completed: list[Beam], active: list[Beam], n: int, aggregation: str,
                sort_completed: bool) -> list[Beam]:
    pool = completed or active
    if sort_completed:
        pool = top(pool, len(pool), aggregation)
    return pool[:n]
