"""Iteration-level scheduling: which sequences compute how many tokens this step.

Every step schedules decodes first (one token each), then prefill chunks, continuing
partially prefilled sequences before admitting new ones. Policies, chosen by name,
decide the token budgets: `sarathi` fills `max_num_batched_tokens` with prefill after
the decodes; `throttle` (gLLM, engine/throttle.py) sizes prefill from the waiting
prompt tokens and the free KV fraction. When blocks run out, the most recently admitted
sequence is preempted by recompute (its blocks are freed; it re-enters the front of the
queue and its full blocks are likely still in the prefix cache).

With `prefix_aware_order` (FastTTS) the waiting queue is regrouped before admission:
requests sharing leading prefix blocks move up behind the first of them (a trie walk in
first-come order), so they are admitted together while their prefix blocks are hot.
With a host KV tier, `prefetch` swaps in the tier's blocks of the waiting requests the
next step is likely to admit (the head of the queue within one step's token budget).

Under pipeline parallelism (pp_size > 1) up to pp microbatches are in flight. Microbatch
k takes the decodes of lane k mod pp (engine/lanes.py); a sequence the engine marks
`in_flight` is neither scheduled nor preempted until its microbatch completes. With
pp_size 1 there is one lane holding every decode.

With partial-block reuse (block_manager.py), a sequence leaving the running set keeps its
last partial block as a tail, and admission takes a tail over after the full-block hits.
A chunk that is a generate sequence's last token, the rest computed, is then scheduled as a
decode: a search step continuing a cached beam then runs in the decode batch (a CUDA graph
replay) instead of making its forward a prefill. Block copies the engine queues (a forked
child's copy of its parent's partial block) ride with the next batch that runs, before its
forward reads any KV.

With `ahead` (async scheduling, pp_size 1) a decode in flight is scheduled again for the
next position while its microbatch runs: it computes the token that microbatch samples,
which the executor fills in (its input here is unknown). Only a decode can go ahead (its
in-flight chunk is exactly one sampled token), by one microbatch, never for a request its
caller aborted nor when its in-flight token must end it by length; one that ends on EOS or
a stop condition is dropped from the later microbatch by the engine.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from tts_runtime.config import SCHEDULER_POLICIES, ConfigError, SchedulerConfig
from tts_runtime.engine.block_manager import ROOT_HASH, BlockManager
from tts_runtime.engine.lanes import update_lanes
from tts_runtime.engine.sequence import Sequence, SequenceStatus
from tts_runtime.engine.throttle import prefill_token_budget


@dataclass
class ScheduledBatch:
    decodes: list[Sequence] = field(default_factory=list)
    prefills: list[tuple[Sequence, int]] = field(default_factory=list)  # (sequence, chunk tokens)
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (source, destination) block ids

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


BudgetPolicy = Callable[["Scheduler", int], TokenBudget]  # (scheduler, decodes ready in the lane)


class Scheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager, pp_size: int = 1,
                 ahead: bool = False, max_model_len: int | None = None) -> None:
        self.config = config
        self.blocks = blocks
        self.pp_size = pp_size
        self.ahead = ahead
        self.max_model_len = max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        # Admissions refused for lack of free blocks (a sign of memory starvation).
        self.num_admission_stalls = 0
        self.budget_policy: BudgetPolicy = budget_policy(config.policy)
        # seq_id -> (tokens, block hashes) of waiting sequences, for the throttle's #WP.
        self._waiting_block_hashes: dict[int, tuple[int, list[int]]] = {}
        # seq_id -> (block cache version, tokens, uncached tokens) of waiting sequences.
        self._waiting_uncached: dict[int, tuple[int, int, int]] = {}
        self._pending_copies: list[tuple[int, int]] = []  # for the next batch that runs

    # -- queue -----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def copy_block(self, source: int, destination: int) -> None:
        """Have the next batch that runs copy a block's KV before its forward."""
        self._pending_copies.append((source, destination))

    def finish(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.FINISHED
        seq.lane = None
        if seq in self.running:
            self.running.remove(seq)
        self._release(seq)
        # A sequence aborted while waiting leaves its lookup memos behind otherwise.
        self._waiting_block_hashes.pop(seq.seq_id, None)
        self._waiting_uncached.pop(seq.seq_id, None)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def num_uncached_prefill_tokens(self) -> int:
        """gLLM's #WP: tokens still to prefill that the prefix cache will not serve. Waiting
        sequences are looked up read-only; running ones already hold their hits. A chunk in
        flight still counts (an overcount of at most one chunk per prefilling sequence)."""
        waiting = sum(self._uncached_waiting_tokens(s) for s in self.waiting)
        return waiting + sum(s.num_uncomputed_tokens for s in self.running if not s.is_decode)

    def _uncached_waiting_tokens(self, seq: Sequence) -> int:
        """A waiting sequence's tokens the prefix cache will not serve, kept per sequence
        until its length or the cache's contents change: the phase policy asks for the sum
        every step, and walking hundreds of waiting score prompts' chains each time was
        7.5% of a simulated run's host time."""
        version = self.blocks.cache_version
        memo = self._waiting_uncached.get(seq.seq_id)
        if memo is None or memo[0] != version or memo[1] != seq.num_tokens:
            hits = self.blocks.num_cached_prefix_blocks(self._waiting_hashes(seq))
            memo = (version, seq.num_tokens, seq.num_tokens - self.blocks.block_size * hits)
            self._waiting_uncached[seq.seq_id] = memo
        return memo[2]

    def _waiting_hashes(self, seq: Sequence) -> list[int]:
        """The chained hashes of the blocks the prefix cache may serve `seq`, kept while it
        waits (its tokens do not change then): hashing every waiting prompt every step
        would cost more than the lookup."""
        if not self.blocks.enable_prefix_caching:
            return []
        memo = self._waiting_block_hashes.get(seq.seq_id)
        if memo is None or memo[0] != seq.num_tokens:
            memo = (seq.num_tokens, self.blocks.full_block_hashes(seq.token_ids, self._prefix_block_limit(seq)))
            self._waiting_block_hashes[seq.seq_id] = memo
        return memo[1]

    def kv_free_fraction(self) -> float:
        """Free blocks (cached-free included) over the blocks usable now (an elastic pool
        moves that number, so it is re-read every call)."""
        usable = self.blocks.num_usable_blocks
        return self.blocks.num_free_blocks / usable if usable else 0.0

    def num_waiting_blocks(self) -> int:
        """Blocks admitting every waiting sequence would add to those held now (cached-free
        hits included). Beams of a problem wait together and share most of their blocks, so
        a prefix block several of them share counts once, and one a running sequence holds
        not at all; counting each sequence's whole length made an elastic donor keep
        several times the memory its queue needs."""
        bs = self.blocks.block_size
        counted: set[int] = set()
        total = 0
        for seq in self.waiting:
            hashes = self._waiting_hashes(seq)
            total += -(-seq.num_tokens // bs) - len(hashes)
            total += sum(1 for h in hashes if h not in counted and not self.blocks.is_held(h))
            counted.update(hashes)
        return total

    def blocks_to_progress(self) -> int:
        """A pool of this many blocks lets the next step compute something: every running
        sequence fits alone (the others can be preempted), or, with none running, the
        next waiting one does."""
        bs = self.blocks.block_size
        seqs = self.running if self.running else list(self.waiting)[:1]
        return max((-(-s.num_tokens // bs) for s in seqs), default=0)

    def preempt_all(self) -> None:
        """Preempt every running sequence not in flight (by recompute), freeing its blocks."""
        for seq in reversed(list(self.running)):
            if not seq.in_flight:
                self._preempt(seq, ScheduledBatch())

    # -- one step --------------------------------------------------------------------
    def schedule(self, microbatch: int = 0) -> ScheduledBatch:
        """The batch for pipeline microbatch `microbatch` (any int; its lane is mod pp_size)."""
        decodes = self._lane_decodes(microbatch)
        if self.ahead:
            decodes += self.ahead_decodes()
        budget = self.budget_policy(self, len(decodes))
        batch = ScheduledBatch()
        decode_budget = budget.decode_tokens
        for seq in decodes:
            if seq.status is not SequenceStatus.RUNNING:  # preempted for an earlier one
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
            if (seq.is_decode or seq.in_flight or seq.status is not SequenceStatus.RUNNING
                    or seq in batch.decodes):
                continue
            chunk = self._chunk(seq, prefill_budget)
            if not self._reserve(seq, chunk, batch):
                break
            self._add_chunk(batch, seq, chunk)
            prefill_budget -= chunk
        if self.config.prefix_aware_order and len(self.waiting) > 1 and self.blocks.enable_prefix_caching:
            ordered = self._prefix_order(list(self.waiting), 0)
            self.waiting.clear()
            self.waiting.extend(ordered)
        while self.waiting and prefill_budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if not self._admit(seq, prefill_budget, batch):
                break
            self.waiting.popleft()
            self._waiting_block_hashes.pop(seq.seq_id, None)
            self._waiting_uncached.pop(seq.seq_id, None)
            chunk = self._chunk(seq, prefill_budget)
            self._add_chunk(batch, seq, chunk)
            prefill_budget -= chunk
        if self._pending_copies and not batch.empty:
            batch.block_copies, self._pending_copies = self._pending_copies, []
        return batch

    def _add_chunk(self, batch: ScheduledBatch, seq: Sequence, tokens: int) -> None:
        if tokens == 1 and seq.num_uncomputed_tokens == 1 and not seq.is_score and self.blocks.reuse_partial_blocks:
            batch.decodes.append(seq)  # the same computation as a decode, in the decode batch
        else:
            batch.prefills.append((seq, tokens))

    def _prefix_order(self, seqs: list[Sequence], depth: int) -> list[Sequence]:
        """Group by the block hash at `depth`, groups in order of first appearance, each
        group ordered the same way one block deeper; sequences without a full block there
        stay in place at the front of their group."""
        groups: dict[tuple[str, int], list[Sequence]] = {}
        for seq in seqs:
            hashes = self._waiting_hashes(seq)
            key = ("block", hashes[depth]) if depth < len(hashes) else ("alone", seq.seq_id)
            groups.setdefault(key, []).append(seq)
        ordered = []
        for group in groups.values():
            ordered += self._prefix_order(group, depth + 1) if len(group) > 1 else group
        return ordered

    def prefetch(self) -> int:
        """Swap in, one step ahead, the host tier's prefix blocks of the waiting sequences at
        the head of the queue, as many as one step's token budget admits (they are next
        whenever a running sequence makes room). Leaves a free block per running sequence
        for its next token. Returns blocks loaded."""
        blocks = self.blocks
        if blocks.host_tier is None:
            return 0
        budget, loaded = self.config.max_num_batched_tokens, 0
        for seq in self.waiting:
            if budget <= 0:
                break
            hashes = self._waiting_hashes(seq)
            loaded += blocks.prefetch(seq.token_ids, hashes, reserve=len(self.running))
            budget -= seq.num_tokens - blocks.block_size * blocks.num_cached_prefix_blocks(hashes)
        return loaded

    def _lane_decodes(self, microbatch: int) -> list[Sequence]:
        """The decodes of this microbatch's lane that are not in flight. A lane with none
        ready (fewer decodes than lanes, or a moved one still in flight) lends the turn to
        the next lane that has some: a microbatch then lacks decodes only when none is
        ready anywhere, so an engine that schedules lanes in turn cannot stall."""
        lanes = update_lanes([s for s in self.running if s.is_decode], self.pp_size)
        for offset in range(self.pp_size):
            ready = [s for s in lanes[(microbatch + offset) % self.pp_size] if not s.in_flight]
            if ready:
                return ready
        return []

    def ahead_decodes(self) -> list[Sequence]:
        """Decodes in flight that may be scheduled again now (async scheduling)."""
        return [s for s in self.running if s.in_flight == 1 and s.is_decode and not s.group.aborted
                and not self._ends_by_length(s)]

    def _ends_by_length(self, seq: Sequence) -> bool:
        """The token its microbatch in flight samples ends it by length (what the engine's
        `_append_token` checks once it is appended)."""
        tokens = seq.num_tokens + 1
        return (tokens - seq.num_prompt_tokens >= seq.group.params.max_tokens
                or (self.max_model_len is not None and tokens >= self.max_model_len))

    def _chunk(self, seq: Sequence, budget: int) -> int:
        limit = self.config.max_prefill_chunk or budget
        return min(seq.num_uncomputed_tokens, budget, limit)

    def _blocks_needed(self, seq: Sequence, new_tokens: int) -> int:
        # A decode going ahead has one more token in flight, computed but not yet counted.
        total = seq.num_computed_tokens + seq.in_flight + new_tokens
        return max(0, -(-total // self.blocks.block_size) - len(seq.block_table))

    def _reserve(self, seq: Sequence, new_tokens: int, batch: ScheduledBatch) -> bool:
        """Make room for `new_tokens` more KV slots, preempting later sequences if needed
        (never one in flight: with only those left, `seq` waits for them to complete)."""
        need = self._blocks_needed(seq, new_tokens)
        while not self.blocks.can_allocate(need):
            victim = next((s for s in reversed(self.running) if not s.in_flight), None)
            if victim is None:
                return False
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
            self._release(seq)
            seq.num_computed_tokens = 0
            self.num_admission_stalls += 1
            return False
        seq.block_table.extend(self.blocks.allocate(need))
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        return True

    def _attach_cached_prefix(self, seq: Sequence) -> None:
        # The phase policy hashed the waiting prompt already (_waiting_hashes): a PRM step
        # admits hundreds of prompts, each hashed again before this.
        hit_ids, hashes = self.blocks.acquire_cached_prefix(seq.token_ids, self._prefix_block_limit(seq),
                                                            self._waiting_hashes(seq))
        seq.block_table = hit_ids
        seq.block_hashes = hashes[:len(hit_ids)]
        seq.num_computed_tokens = len(hit_ids) * self.blocks.block_size
        self._attach_tail(seq)
        if seq.index == 0 and seq.num_tokens <= seq.num_prompt_tokens:
            seq.group.num_cached_prompt_tokens = seq.num_computed_tokens
            seq.group.prompt_looked_up = True

    def _attach_tail(self, seq: Sequence) -> None:
        """Take over a cached partial block continuing the full-block hits. For a score
        request, only when its first scored position lies in a later block: its chunk then
        starts on a block boundary, as without tails (the simulated PRM seeds its scores with
        a row's tokens from the start of its block or chunk)."""
        if not self.blocks.reuse_partial_blocks:
            return
        start = seq.num_computed_tokens
        most = seq.num_tokens - 1 - start
        if seq.is_score and min(seq.group.params.positions) < start + self.blocks.block_size:
            return
        parent = seq.block_hashes[-1] if seq.block_hashes else ROOT_HASH
        taken = self.blocks.take_tail(parent, seq.token_ids, start, most) if most > 0 else None
        if taken is not None:
            block_id, tokens = taken
            seq.block_table.append(block_id)
            seq.num_computed_tokens += tokens

    def _release(self, seq: Sequence) -> None:
        """Free the sequence's blocks, keeping its computed partial last block as a tail."""
        bs = self.blocks.block_size
        full = len(seq.block_hashes)
        if len(seq.block_table) > full and full == seq.num_computed_tokens // bs:
            parent = seq.block_hashes[-1] if full else ROOT_HASH
            self.blocks.keep_tail(seq.block_table[full], parent, tuple(seq.token_ids[full * bs:seq.num_computed_tokens]))
        self.blocks.free(seq.block_table)
        seq.block_table = []

    def _prefix_block_limit(self, seq: Sequence) -> int:
        """Most full blocks of `seq` the prefix cache may serve. Always leave at least the
        last token to compute (its logits are needed), and for score requests every
        requested position must be computed, not served from cache."""
        limit = seq.num_tokens - 1
        if seq.is_score:
            limit = min(limit, min(seq.group.params.positions))
        return limit // self.blocks.block_size

    def _preempt(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.running.remove(seq)
        if seq in batch.decodes:
            batch.decodes.remove(seq)
        batch.prefills = [(s, n) for s, n in batch.prefills if s is not seq]
        self._release(seq)
        seq.block_hashes, seq.num_computed_tokens = [], 0
        seq.status, seq.lane = SequenceStatus.WAITING, None
        self.waiting.appendleft(seq)
        self.num_preemptions += 1


def _sarathi_budget(scheduler: Scheduler, decodes: int) -> TokenBudget:
    total = scheduler.config.max_num_batched_tokens
    decode_tokens = min(decodes, total)
    return TokenBudget(decode_tokens=decode_tokens, prefill_tokens=total - decode_tokens)


def _throttle_budget(scheduler: Scheduler, decodes: int) -> TokenBudget:
    """gLLM: the lane's decodes plus #P prefill tokens; the step stays within
    max_num_batched_tokens too (the size the memory profile was taken at)."""
    config = scheduler.config.throttle
    total = scheduler.config.max_num_batched_tokens
    decode_tokens = min(decodes, total)
    prefill = prefill_token_budget(scheduler.num_uncached_prefill_tokens(), scheduler.kv_free_fraction(), config)
    if prefill == 0 and not any(s.is_decode or s.in_flight for s in scheduler.running):
        # Below the KV threshold with no decode left to finish and free blocks, waiting
        # would never end: let #MinP tokens through (preempting, as sarathi does, if needed).
        prefill = max(config.min_prefill, 1)
    return TokenBudget(decode_tokens=decode_tokens, prefill_tokens=min(prefill, total - decode_tokens))


_POLICIES: dict[str, BudgetPolicy] = dict(zip(SCHEDULER_POLICIES, (_sarathi_budget, _throttle_budget), strict=True))


def budget_policy(name: str) -> BudgetPolicy:
    """The policy SchedulerConfig names (it checks the name against SCHEDULER_POLICIES)."""
    return _POLICIES[name]
