"""Which layers each pipeline stage runs.

The default split balances the measured time of each stage (layer_costs.py): its layers,
and on the last stage the output head, which for a generator runs on every sampled row
over the whole vocabulary (SmolLM2-135M's head costs several of its layers) and for a
scoring model (the PRM) only on a few candidate columns. `--pp-layers` overrides the
generator's split.
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence

from tts_runtime.config import ConfigError
from tts_runtime.executor.layer_costs import StageCosts
from tts_runtime.models.arch import ArchConfig


def balanced_split(layer_costs: Sequence[float], pp_size: int, head: float) -> list[int]:
    """Layer counts per stage (each >= 1) minimising the costliest stage; the head adds to
    the last stage. Exhaustive over cut points is cheap at these sizes, so it is exact."""
    num_layers = len(layer_costs)
    if pp_size > num_layers:
        raise ConfigError(f"--pp {pp_size} needs at least {pp_size} layers; the model has {num_layers}")
    prefix = list(itertools.accumulate(layer_costs, initial=0.0))
    best: tuple[float, list[int]] | None = None
    for cuts in itertools.combinations(range(1, num_layers), pp_size - 1):
        bounds = (0, *cuts, num_layers)
        stage_costs = [prefix[end] - prefix[start] for start, end in zip(bounds, bounds[1:])]
        stage_costs[-1] += head
        if best is None or max(stage_costs) < best[0]:
            best = (max(stage_costs), [end - start for start, end in zip(bounds, bounds[1:])])
    assert best is not None
    return best[1]


def stage_layers(arch: ArchConfig, pp_size: int, counts: tuple[int, ...] | None,
                 measure: Callable[[], StageCosts]) -> list[range]:
    """The contiguous layer range of each stage: `counts` (--pp-layers), else balanced on
    the costs `measure` returns (called only then: it runs the model)."""
    if counts is None and pp_size == 1:
        counts = (arch.num_layers,)  # one stage (an overlap worker): nothing to balance
    elif counts is None:
        costs = measure()
        counts = tuple(balanced_split(costs.layers, pp_size, costs.head))
    elif sum(counts) != arch.num_layers:
        raise ConfigError(f"--pp-layers {','.join(map(str, counts))} adds up to {sum(counts)} layers; "
                          f"the model has {arch.num_layers}")
    ranges, start = [], 0
    for count in counts:
        ranges.append(range(start, start + count))
        start += count
    return ranges
