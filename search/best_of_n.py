"""Best-of-N: N whole solutions sampled from the prompt, every step PRM-scored.

The answer is picked from the N samples by the shared final pick (naive argmax of the
aggregated score, plus weighted and majority votes), as search-and-learn does.
"""

from __future__ import annotations

from search.beam_state import Beam, StepBackend


async def best_of_n(steps: StepBackend) -> list[Beam]:
    steps.counts.iterations = 1
    [samples] = await steps.expand([steps.root()], 0, width=steps.config.n, to_eos=True)
    await steps.score(samples)
    return samples
