"""The elastic split policy: between engine steps, move free KV chunks to the starved model.

Called once per runtime step with each model's `Pressure`; moves chunks through the
pool (memory/pool.py), which never touches a block in use and gives up never-cached
blocks before cached ones. Three rules, in order:

1. Progress. A model with work must own at least the blocks its largest sequence needs
   (`blocks_to_progress`), or its scheduler cannot step. It takes what it lacks from the
   other model's free chunks. If that is not enough, it sits this step out; if neither
   model can step, the one holding fewer blocks preempts its running sequences so the
   other can take their chunks (only possible when one sequence of each model together
   overflow the whole budget).
2. Hard starvation: preemptions or refused admissions since the last step. The model
   takes enough chunks to admit what waits (waiting blocks - free blocks), from a
   donor that is not itself hard-starved, down to what the donor's own running and
   waiting sequences hold.
3. Soft starvation: thrash (misses on prefix blocks evicted earlier). The model takes
   as many blocks as it just recomputed, but only while its recent thrash clearly
   exceeds the donor's: memory drifts toward the model whose cache loses more, and
   stops when losses balance, instead of sloshing back and forth.

Every move is logged (pool.moves) with its reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from memory.pool import ChunkMove, ElasticKVPool

# Recent thrash decays by this factor per runtime step (half-life ~350 steps: a few
# beam-search iterations, so both models' phases are in view when they are compared).
_THRASH_DECAY = 0.998
# A soft move needs the receiver's recent thrash to exceed the donor's by this factor.
_SOFT_MARGIN = 1.5


@dataclass(frozen=True)
class Pressure:
    """One model's state between steps, read by the runtime from its engine."""

    has_work: bool
    owned_blocks: int
    free_blocks: int
    waiting_blocks: int  # blocks its waiting sequences would hold
    blocks_to_progress: int
    preemptions: int  # totals since the start; the policy takes differences
    admission_stalls: int
    thrash_events: int


@dataclass
class ElasticPolicy:
    pool: ElasticKVPool
    _last: dict[str, Pressure] = field(default_factory=dict)
    _recent_thrash: dict[str, float] = field(default_factory=dict)

    def rebalance(self, pressures: dict[str, Pressure], step: int,
                  yield_memory: dict[str, Callable[[], Pressure]]) -> set[str]:
        """Move chunks for this step; returns the models that can step now.
        `yield_memory[m]()` preempts all of m's running sequences and returns its new
        pressure (rule 1's last resort)."""
        pressures = dict(pressures)
        first, second = pressures
        runnable = self._ensure_progress(pressures, step, yield_memory)
        for receiver, donor in ((first, second), (second, first)):
            self._relieve(receiver, donor, pressures, step)
        self._last = dict(pressures)
        return runnable

    # -- rule 1 ----------------------------------------------------------------------
    def _ensure_progress(self, pressures: dict[str, Pressure], step: int,
                         yield_memory: dict[str, Callable[[], Pressure]]) -> set[str]:
        stuck = [m for m, p in pressures.items() if p.has_work and self._owned(m) < p.blocks_to_progress]
        for member in stuck:
            donor = self._other(member, pressures)
            lacking = pressures[member].blocks_to_progress - self._owned(member)
            self._move(donor, member, lacking, pressures, step,
                       f"progress: {member} needs {pressures[member].blocks_to_progress} blocks "
                       f"for its largest sequence and owns {self._owned(member)}")
        stuck = [m for m, p in pressures.items() if p.has_work and self._owned(m) < p.blocks_to_progress]
        if len(stuck) == 2:
            yielder = min(stuck, key=self._owned)
            keeper = self._other(yielder, pressures)
            pressures[yielder] = yield_memory[yielder]()
            lacking = pressures[keeper].blocks_to_progress - self._owned(keeper)
            # The yielder waits until the keeper's sequence is done: it keeps nothing back.
            self._move(yielder, keeper, lacking, pressures, step,
                       f"progress: neither model could step; {yielder} preempted its sequences "
                       f"so {keeper} can run its largest", keep=0)
        return {m for m, p in pressures.items()
                if p.has_work and self._owned(m) >= p.blocks_to_progress}

    # -- rules 2 and 3 ---------------------------------------------------------------
    def _relieve(self, receiver: str, donor: str, pressures: dict[str, Pressure], step: int) -> None:
        now, before = pressures[receiver], self._last.get(receiver)
        if before is None:
            return
        hard = now.preemptions > before.preemptions or now.admission_stalls > before.admission_stalls
        donor_now, donor_before = pressures[donor], self._last.get(donor, pressures[donor])
        donor_hard = (donor_now.preemptions > donor_before.preemptions
                      or donor_now.admission_stalls > donor_before.admission_stalls)
        thrashed = now.thrash_events - before.thrash_events
        recent = self._recent_thrash.get(receiver, 0.0) * _THRASH_DECAY + thrashed
        self._recent_thrash[receiver] = recent
        if hard and not donor_hard:
            deficit = max(now.waiting_blocks - now.free_blocks, 1)
            self._move(donor, receiver, deficit, pressures, step,
                       f"starved: {receiver} preempted or could not admit "
                       f"({now.waiting_blocks} waiting blocks, {now.free_blocks} free)")
        elif thrashed > 0 and not donor_hard and recent > _SOFT_MARGIN * self._recent_thrash.get(donor, 0.0):
            self._move(donor, receiver, thrashed, pressures, step,
                       f"thrash: {receiver} recomputed {thrashed} evicted blocks (recent {recent:.0f} vs "
                       f"{donor} {self._recent_thrash.get(donor, 0.0):.0f})")

    # -- moving ----------------------------------------------------------------------
    def _move(self, donor: str, receiver: str, blocks: int, pressures: dict[str, Pressure],
              step: int, reason: str, keep: int | None = None) -> ChunkMove | None:
        layout = self.pool.layout.members
        wanted = math.ceil(blocks / layout[receiver].blocks_per_chunk)
        keep = self._keep(donor, pressures) if keep is None else keep
        spare = (self._owned(donor) - keep) // layout[donor].blocks_per_chunk
        return self.pool.move(donor, receiver, min(wanted, spare), step, reason)

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
