"""Decode lanes: which microbatch of a pipeline runs which decode.

With pp microbatches in flight, microbatch k runs the decodes of lane k mod pp. A decode
keeps its lane from the step it becomes a decode until it finishes or is preempted, so a
lane's consecutive microbatches carry the same sequences (SiPipe prepares and reuses
their inputs). A new decode joins the emptiest lane; lanes are rebalanced only when two
differ by more than one sequence. Each lane then holds the floor or the ceiling of
decodes / pp, and the pp microbatches together take every decode: gLLM's #D, without its
reshuffling.
"""

from __future__ import annotations

from tts_runtime.engine.sequence import Sequence


def update_lanes(decodes: list[Sequence], pp_size: int) -> list[list[Sequence]]:
    """Give lanes to the running decodes (in-flight ones included) and return the lanes,
    each in the order of `decodes`."""
    sizes = [0] * pp_size
    for seq in decodes:
        if seq.lane is not None:
            sizes[seq.lane] += 1
    for seq in decodes:
        if seq.lane is None:
            seq.lane = sizes.index(min(sizes))
            sizes[seq.lane] += 1
    while max(sizes) - min(sizes) > 1:
        source, target = sizes.index(max(sizes)), sizes.index(min(sizes))
        _pick_mover(decodes, source).lane = target
        sizes[source] -= 1
        sizes[target] += 1
    return [[seq for seq in decodes if seq.lane == k] for k in range(pp_size)]


def _pick_mover(decodes: list[Sequence], lane: int) -> Sequence:
    """The lane's last sequence not in flight (it can run in its new lane at once), or its
    last one if all are in flight."""
    members = [seq for seq in decodes if seq.lane == lane]
    idle = [seq for seq in members if not seq.in_flight]
    return (idle or members)[-1]
