"""The elastic split policy: between engine steps, move free KV chunks to the starved model.

Called once per runtime step with each model's `Pressure`; moves chunks through the
pool (memory/pool.py), which never touches a block in use and, among free chunks, gives
up those holding no cached block before those holding the least recently used ones.
Three rules, in order:

1. Progress. A model with work must own at least the blocks its largest sequence needs
   (`blocks_to_progress`), or its scheduler cannot step. It takes what it lacks from the
   other model's free chunks, cached or not. If that is not enough it sits this step
   out; if neither model can step, the one owning fewer blocks preempts its running
   sequences so that the other can take their chunks (this needs one sequence of each
   model that together overflow the whole budget).
2. Starvation: preemptions or refused admissions since the last step. The model takes
   enough chunks to admit what waits (waiting blocks - free blocks), but only chunks
   the donor holds no cached prefix in: memory the donor does not use at all. A burst
   of waiting requests is served over several steps anyway, and taking the other
   model's cache for it just moves the recomputation there (the first benchmark of
   this policy did exactly that, sloshing large moves back and forth). Unless the
   starved model's recent recompute cost clearly exceeds the donor's (rule 3's test):
   then the donor's cache is worth less than what the starved model loses, and waiting
   for thrash to move memory a few blocks a step left a PRM-heavy phase thrashing
   through most of its length (docs/benchmarks/memory_shifting.md).
3. Cache pressure: thrash, i.e. recomputing prefix blocks evicted earlier. The model
   takes as many blocks as it just recomputed, cached chunks included (least recently
   used first), while its recent recompute cost clearly exceeds the donor's. Costs are
   thrashed blocks x the model's FLOPs per recomputed block, so memory drifts to where
   it saves more compute, and stops when the losses balance.

Every move is logged (pool.moves) with its reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from memory.pool import ChunkMove, ElasticKVPool
from tts_runtime.engine.engine import EnginePressure

# Recent recompute cost decays by this factor per runtime step (half-life ~350 steps: a
# few beam-search iterations, so both models' phases are in view when compared).
_COST_DECAY = 0.998
# A cache-pressure move needs the receiver's recent cost to exceed the donor's by this factor.
_MARGIN = 1.5


@dataclass(frozen=True)
class Pressure(EnginePressure):
    """One model's state between steps: what its engine reports, and its thrash count."""

    thrash_events: int


@dataclass
class ElasticPolicy:
    pool: ElasticKVPool
    block_costs: dict[str, float]  # per model: FLOPs to recompute one KV block
    _last: dict[str, Pressure] = field(default_factory=dict)
    _recent_cost: dict[str, float] = field(default_factory=dict)

    def rebalance(self, pressures: dict[str, Pressure], step: int,
                  yield_memory: dict[str, Callable[[], Pressure]]) -> set[str]:
        """Move chunks for this step; returns the models that can step now.
        `yield_memory[m]()` preempts all of m's running sequences and returns its new
        pressure (rule 1's last resort)."""
        pressures = dict(pressures)
        runnable = self._ensure_progress(pressures, step, yield_memory)
        if len(self._last) == len(pressures):
            for member, p in pressures.items():
                thrashed = p.thrash_events - self._last[member].thrash_events
                self._recent_cost[member] = (self._recent_cost.get(member, 0.0) * _COST_DECAY
                                             + thrashed * self.block_costs[member])
            first, second = pressures
            for receiver, donor in ((first, second), (second, first)):
                self._relieve(receiver, donor, pressures, step)
        self._last = pressures
        return runnable

    # -- rule 1 ----------------------------------------------------------------------
    def _ensure_progress(self, pressures: dict[str, Pressure], step: int,
                         yield_memory: dict[str, Callable[[], Pressure]]) -> set[str]:
        for member in self._stuck(pressures):
            donor = self._other(member, pressures)
            lacking = pressures[member].blocks_to_progress - self._owned(member)
            self._move(donor, member, lacking, pressures, step,
                       f"progress: {member} needs {pressures[member].blocks_to_progress} blocks "
                       f"for its largest sequence and owns {self._owned(member)}")
        stuck = self._stuck(pressures)
        if len(stuck) == 2:
            yielder = min(stuck, key=self._owned)
            keeper = self._other(yielder, pressures)
            pressures[yielder] = yield_memory[yielder]()
            lacking = pressures[keeper].blocks_to_progress - self._owned(keeper)
            # The yielder waits until the keeper's sequence is done: it keeps nothing back.
            self._move(yielder, keeper, lacking, pressures, step,
                       f"progress: neither model could step; {yielder} preempted its sequences "
                       f"so {keeper} can run its largest", keep=0)
        return {m for m, p in pressures.items() if p.has_work and self._owned(m) >= p.blocks_to_progress}

    def _stuck(self, pressures: dict[str, Pressure]) -> list[str]:
        return [m for m, p in pressures.items() if p.has_work and self._owned(m) < p.blocks_to_progress]

    # -- rules 2 and 3 ---------------------------------------------------------------
    def _starved(self, member: str, pressures: dict[str, Pressure]) -> bool:
        now, before = pressures[member], self._last[member]
        return now.preemptions > before.preemptions or now.admission_stalls > before.admission_stalls

    def _relieve(self, receiver: str, donor: str, pressures: dict[str, Pressure], step: int) -> None:
        now = pressures[receiver]
        mine, theirs = self._recent_cost[receiver], self._recent_cost[donor]
        losing_more = mine > _MARGIN * theirs
        if self._starved(receiver, pressures) and not self._starved(donor, pressures):
            deficit = max(now.waiting_blocks - now.free_blocks, 1)
            taken = "free chunks, cached ones included" if losing_more else "unused chunks"
            self._move(donor, receiver, deficit, pressures, step,
                       f"starved: {receiver} preempted or could not admit ({now.waiting_blocks} waiting "
                       f"blocks, {now.free_blocks} free); takes {donor}'s {taken}", allow_cached=losing_more)
        thrashed = now.thrash_events - self._last[receiver].thrash_events
        if thrashed > 0 and losing_more:
            self._move(donor, receiver, thrashed, pressures, step,
                       f"thrash: {receiver} recomputed {thrashed} evicted blocks; recent recompute "
                       f"{mine:.3g} vs {donor} {theirs:.3g} FLOPs")

    # -- moving ----------------------------------------------------------------------
    def _move(self, donor: str, receiver: str, blocks: int, pressures: dict[str, Pressure], step: int,
              reason: str, keep: int | None = None, allow_cached: bool = True) -> ChunkMove | None:
        layout = self.pool.layout.members
        wanted = math.ceil(blocks / layout[receiver].blocks_per_chunk)
        keep = self._keep(donor, pressures) if keep is None else keep
        spare = (self._owned(donor) - keep) // layout[donor].blocks_per_chunk
        return self.pool.move(donor, receiver, min(wanted, spare), step, reason, allow_cached)

    def _keep(self, member: str, pressures: dict[str, Pressure]) -> int:
        """Blocks a donor keeps: what its own next step and its queue need."""
        p = pressures[member]
        if not p.has_work:
            return 0
        held = p.owned_blocks - p.free_blocks
        return max(p.blocks_to_progress, held + p.waiting_blocks)

    def _owned(self, member: str) -> int:
        return self.pool.num_blocks_of(member)

    @staticmethod
    def _other(member: str, pressures: dict[str, Pressure]) -> str:
        return next(m for m in pressures if m != member)
