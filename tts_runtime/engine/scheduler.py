"""Iteration-level scheduling: which sequences compute how many tokens this step.

Policies are chosen by name. `sarathi` schedules every running decode first (one token
each), then fills the remaining token budget with prefill chunks, continuing partially
prefilled sequences before admitting new ones. When blocks run out, the most recently
admitted sequence is preempted by recompute (its blocks are freed; it re-enters the
front of the queue and its full blocks are likely still in the prefix cache).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from tts_runtime.config import ConfigError, SchedulerConfig
from tts_runtime.engine.block_manager import BlockManager
from tts_runtime.engine.sequence import Sequence, SequenceStatus


@dataclass
class ScheduledBatch:
    decodes: list[Sequence] = field(default_factory=list)
    prefills: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, chunk tokens)

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(n for _, n in self.prefills)

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills


@dataclass
class TokenBudget:
    """How many tokens a step may compute; a policy may shape it per step."""

    decode_tokens: int
    prefill_tokens: int


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # Admissions refused for lack of free blocks (a sign of memory starvation).
        self.num_admission_stalls = 0
        self.budget_policy: Callable[[Scheduler], TokenBudget] = budget_policy(config.policy)

    # -- queue -----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def add_front(self, seq: Sequence) -> None:
        self.waiting.appendleft(seq)

    def finish(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.FINISHED
        if seq in self.running:
            self.running.remove(seq)
        self.blocks.free(seq.block_table)
        seq.block_table = []

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def num_waiting_prefill_tokens(self) -> int:
        pending = sum(s.num_uncomputed_tokens for s in self.waiting)
        return pending + sum(s.num_uncomputed_tokens for s in self.running if not s.is_decode)

    def num_waiting_blocks(self) -> int:
        """Blocks the waiting sequences would hold once admitted (cache hits included)."""
        bs = self.blocks.block_size
        return sum(-(-s.num_tokens // bs) for s in self.waiting)

    def blocks_to_progress(self) -> int:
        """A pool of this many blocks lets the next step compute something: every running
        sequence fits alone (the others can be preempted), or, with none running, the
        next waiting one does."""
        bs = self.blocks.block_size
        seqs = self.running if self.running else list(self.waiting)[:1]
        return max((-(-s.num_tokens // bs) for s in seqs), default=0)

    def preempt_all(self) -> None:
        """Preempt every running sequence (by recompute), freeing all blocks they hold."""
        for seq in reversed(list(self.running)):
            self._preempt(seq, ScheduledBatch())

    # -- one step --------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        budget = self.budget_policy(self)
        batch = ScheduledBatch()
        decode_budget = budget.decode_tokens
        for seq in list(self.running):
            if not seq.is_decode or seq.status is not SequenceStatus.RUNNING:
                continue
            if decode_budget == 0:
                break
            if self._reserve(seq, 1, batch):
                batch.decodes.append(seq)
                decode_budget -= 1
        prefill_budget = budget.prefill_tokens
        for seq in list(self.running):
            if prefill_budget <= 0:
                break
            if seq.is_decode or seq.status is not SequenceStatus.RUNNING or seq in batch.decodes:
                continue
            chunk = self._chunk(seq, prefill_budget)
            if not self._reserve(seq, chunk, batch):
                break
            batch.prefills.append((seq, chunk))
            prefill_budget -= chunk
        while self.waiting and prefill_budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if not self._admit(seq, prefill_budget, batch):
                break
            self.waiting.popleft()
            chunk = self._chunk(seq, prefill_budget)
            batch.prefills.append((seq, chunk))
            prefill_budget -= chunk
        return batch

    def _chunk(self, seq: Sequence, budget: int) -> int:
        limit = self.config.max_prefill_chunk or budget
        return min(seq.num_uncomputed_tokens, budget, limit)

    def _blocks_needed(self, seq: Sequence, new_tokens: int) -> int:
        total = seq.num_computed_tokens + new_tokens
        return max(0, -(-total // self.blocks.block_size) - len(seq.block_table))

    def _reserve(self, seq: Sequence, new_tokens: int, batch: ScheduledBatch) -> bool:
        """Make room for `new_tokens` more KV slots, preempting later sequences if needed."""
        need = self._blocks_needed(seq, new_tokens)
        while not self.blocks.can_allocate(need):
            victim = self.running[-1]
            self._preempt(victim, batch)
            if victim is seq:
                return False
        seq.block_table.extend(self.blocks.allocate(need))
        return True

    def _admit(self, seq: Sequence, budget: int, batch: ScheduledBatch) -> bool:
        if seq.num_computed_tokens == 0 and not seq.block_table:
            self._attach_cached_prefix(seq)
        chunk = self._chunk(seq, budget)
        need = self._blocks_needed(seq, chunk)
        if not self.blocks.can_allocate(need):
            if not self.running:
                raise ConfigError(
                    f"KV cache too small: a sequence needs {len(seq.block_table) + need} blocks "
                    f"of {self.blocks.block_size} tokens but the pool has {self.blocks.num_usable_blocks}; "
                    "raise --kv-cache-memory / the device memory budget")
            self.blocks.free(seq.block_table)
            seq.block_table, seq.num_computed_tokens = [], 0
            self.num_admission_stalls += 1
            return False
        seq.block_table.extend(self.blocks.allocate(need))
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return True

    def _attach_cached_prefix(self, seq: Sequence) -> None:
        # Always leave at least the last token to compute (its logits are needed), and for
        # score requests every requested position must be computed, not served from cache.
        limit = seq.num_tokens - 1
        if seq.is_score:
            limit = min(limit, min(seq.group.params.positions))
        max_blocks = limit // self.blocks.block_size
        hit_ids, hashes = self.blocks.acquire_cached_prefix(seq.token_ids, max_blocks)
        seq.block_table = hit_ids
        seq.block_hashes = hashes[:len(hit_ids)]
        seq.num_computed_tokens = len(hit_ids) * self.blocks.block_size
        if seq.index == 0 and seq.num_tokens <= seq.num_prompt_tokens:
            seq.group.num_cached_prompt_tokens = seq.num_computed_tokens

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        if seq in batch.decodes:
            batch.decodes.remove(seq)
        batch.prefills = [(s, n) for s, n in batch.prefills if s is not seq]
        self.blocks.free(seq.block_table)
        seq.block_table, seq.block_hashes, seq.num_computed_tokens = [], [], 0
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1


def _sarathi_budget(scheduler: Scheduler) -> TokenBudget:
    total = scheduler.config.max_num_batched_tokens
    decodes = sum(1 for s in scheduler.running if s.is_decode)
    decode_tokens = min(decodes, total)
    return TokenBudget(decode_tokens=decode_tokens, prefill_tokens=total - decode_tokens)


_POLICIES: dict[str, Callable[[Scheduler], TokenBudget]] = {"sarathi": _sarathi_budget}


def budget_policy(name: str) -> Callable[[Scheduler], TokenBudget]:
    if name not in _POLICIES:
        raise ConfigError(f"unknown scheduler policy '{name}'; choose one of {', '.join(sorted(_POLICIES))}")
    return _POLICIES[name]
