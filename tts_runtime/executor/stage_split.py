"""Which layers each pipeline stage runs.

The default split balances a cost model per stage: a layer costs its multiply-adds per
token (its weights), and the last stage also carries the output head, which for a
generator runs on every sampled row over the whole vocabulary (SmolLM2-135M's head
weighs as much as eight of its layers). A scoring model (the PRM) projects onto a few
candidate columns only, so its head costs nothing here. `--pp-layers` overrides.
"""

from __future__ import annotations

from tts_runtime.config import ConfigError
from tts_runtime.models.arch import ArchConfig


def layer_cost(arch: ArchConfig) -> int:
    """Multiply-adds per token of one decoder layer."""
    attention = arch.hidden_size * arch.head_dim * (2 * arch.num_heads + 2 * arch.num_kv_heads)
    return attention + 3 * arch.hidden_size * arch.intermediate_size


def head_cost(arch: ArchConfig, full_vocabulary: bool) -> int:
    return arch.hidden_size * arch.vocab_size if full_vocabulary else 0


def balanced_split(num_layers: int, pp_size: int, layer: int, head: int) -> list[int]:
    """Layer counts per stage (each >= 1) minimising the costliest stage; the head adds to
    the last stage. Exhaustive over cut points is cheap at these sizes, so it is exact."""
    if pp_size > num_layers:
        raise ConfigError(f"--pp {pp_size} needs at least {pp_size} layers; the model has {num_layers}")
    best: tuple[int, list[int]] | None = None

    def search(counts: list[int], left: int) -> None:
        nonlocal best
        stages_left = pp_size - len(counts)
        if stages_left == 1:
            split = counts + [left]
            worst = max([c * layer for c in split[:-1]] + [left * layer + head])  # one stage: the head's
            if best is None or worst < best[0]:
                best = (worst, split)
            return
        for count in range(1, left - stages_left + 2):
            search(counts + [count], left - count)

    search([], num_layers)
    assert best is not None
    return best[1]


def stage_layers(arch: ArchConfig, pp_size: int, counts: tuple[int, ...] | None,
                 full_vocabulary_head: bool) -> list[range]:
    """The contiguous layer range of each stage."""
    if counts is None:
        counts = tuple(balanced_split(arch.num_layers, pp_size, layer_cost(arch),
                                      head_cost(arch, full_vocabulary_head)))
    elif sum(counts) != arch.num_layers:
        raise ConfigError(f"--pp-layers {','.join(map(str, counts))} adds up to {sum(counts)} layers; "
                          f"the model has {arch.num_layers}")
    ranges, start = [], 0
    for count in counts:
        ranges.append(range(start, start + count))
        start += count
    return ranges
