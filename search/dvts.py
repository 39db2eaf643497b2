"""Diverse verifier tree search (search-and-learn's `_dvts`).

n // M independent subtrees. Each iteration every live subtree samples M candidate next
steps from its current beam, the PRM scores them, and the subtree moves to its best
candidate. A subtree stops when that candidate completed (EOS, length, empty step) or its
text holds a boxed answer. The result is every subtree's last M candidates (n leaves):
the chosen one and its siblings, so votes see n answers as in search-and-learn.
"""

from __future__ import annotations

from search.beam_state import FINISH_ANSWER, Beam, StepBackend

_ANSWER_MARK = "boxed{"


async def dvts(steps: StepBackend) -> list[Beam]:
    config = steps.config
    root = steps.root()
    heads = [root] * config.keep  # each subtree's current beam
    leaves: list[list[Beam]] = [[] for _ in heads]
    for iteration in range(config.num_iterations):
        live = [i for i, head in enumerate(heads) if not head.completed]
        if not live:
            break
        steps.counts.iterations = iteration + 1
        last = iteration == config.num_iterations - 1
        expanded = await steps.expand([heads[i] for i in live], iteration, width=config.beam_width,
                                      to_eos=last and config.eos_sampling)
        await steps.score([beam for candidates in expanded for beam in candidates])
        for i, candidates in zip(live, expanded):
            leaves[i] = candidates
            best = max(candidates, key=lambda beam: beam.score(config.aggregation))
            if not best.completed and _ANSWER_MARK in best.text:
                best.finish_reason = FINISH_ANSWER
            heads[i] = best
    return [beam for candidates in leaves for beam in candidates]
