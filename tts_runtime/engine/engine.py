"""The inference engine: requests in, one scheduled forward per `step`, results out.

Async scheduling (SchedulerConfig.async_scheduling, on executors that fill placeholders: the
simulated device): `launch` keeps one microbatch more in flight than the executor's depth,
whose decodes continue those of the microbatch before it (scheduler.py, `ahead`). So the
host schedules and builds step N+1, and processes step N's outputs, while the device runs.
A sequence that step N ends (EOS, stop, length) or whose request was aborted is dropped
from step N+1's results when they arrive; its blocks were freed when it ended. The slot
step N+1 writes for it is past its last full block, so in no block the prefix cache can
serve, and on one stream any later forward that reuses the block runs after that write.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cached_property

import torch

from tts_runtime.config import ConfigError, EngineConfig, ModelSpec, resolve_device, resolve_dtype
from tts_runtime.engine.batch_builder import BatchLayout, build_model_input
from tts_runtime.engine.block_manager import ROOT_HASH, BlockManager
from tts_runtime.engine.blocking_calls import BlockingCalls
from tts_runtime.engine.busy import BusyClock
from tts_runtime.engine.detokenizer import IncrementalDetokenizer
from tts_runtime.engine.events import BlockEventListener
from tts_runtime.engine.forward_costs import ForwardCostSums
from tts_runtime.engine.host_times import HostTimes
from tts_runtime.engine.request import (CompletionOutput, RequestError, RequestOutput, SamplingParams, ScoreParams,
                                        validate_request)
from tts_runtime.engine.scheduler import ScheduledBatch, Scheduler
from tts_runtime.engine.sequence import RequestGroup, Sequence, SequenceStatus
from tts_runtime.engine.tiered_kv import TieredKV
from tts_runtime.executor.batch import ModelOutput, SamplePlan
from tts_runtime.executor.build_executor import Executor, build_executor
from tts_runtime.executor.kv_cache import KVAllocation, bytes_per_block
from tts_runtime.executor.sampler import SamplingRow, child_seed, sample
from tts_runtime.models.loader import LoadedModel, load_model

DEFAULT_CPU_KV_BYTES = 1 << 30


@dataclass
class _Microbatch:
    layout: BatchLayout
    plan: SamplePlan
    future: Future[ModelOutput]
    decodes: int
    prefill_tokens: int
    launched_at: float
    finished_at: float = 0.0

    def finish(self, _: Future | None = None) -> None:
        self.finished_at = time.perf_counter()


@dataclass
class EngineStats:
    steps: int = 0
    prompt_tokens: int = 0
    computed_tokens: int = 0  # tokens that went through the model
    cached_prompt_tokens: int = 0  # prompt tokens served from the prefix cache
    generated_tokens: int = 0
    scored_positions: int = 0
    decode_batch_sizes: list[int] = field(default_factory=list)
    batch_seqs: list[int] = field(default_factory=list)  # sequences in each launched microbatch
    microbatch_tokens: list[int] = field(default_factory=list)  # tokens of each launched microbatch
    in_flight_at_launch: list[int] = field(default_factory=list)  # microbatches in flight, this one included
    forward_costs: ForwardCostSums = ForwardCostSums()  # seconds of each forward by its shape

    def as_dict(self) -> dict:
        sizes, depth = self.decode_batch_sizes, self.in_flight_at_launch
        return {
            "steps": self.steps, "prompt_tokens": self.prompt_tokens,
            "computed_tokens": self.computed_tokens, "cached_prompt_tokens": self.cached_prompt_tokens,
            "generated_tokens": self.generated_tokens, "scored_positions": self.scored_positions,
            "mean_decode_batch": sum(sizes) / len(sizes) if sizes else 0.0,
            "mean_batch_seqs": sum(self.batch_seqs) / len(self.batch_seqs) if self.batch_seqs else 0.0,
            "mean_in_flight": sum(depth) / len(depth) if depth else 0.0,
        }


@dataclass(frozen=True)
class BlockCounts:
    usable: int  # ids this engine may use now (an elastic pool moves them)
    in_use: int
    cached_free: int  # free, but still holding a cached prefix
    free: int  # free, cached or not


@dataclass(frozen=True)
class EnginePressure:
    """What a memory policy reads between steps to decide who needs KV."""

    has_work: bool
    owned_blocks: int
    free_blocks: int
    blocks_to_progress: int
    preemptions: int  # totals since the start
    admission_stalls: int
    # Counting walks every waiting sequence's blocks (13% of a memory-starved elastic run's
    # samples when taken every step); the elastic policy reads it only when it would move
    # memory, so it is taken then, once.
    count_waiting_blocks: Callable[[], int] = field(repr=False, compare=False)

    @cached_property
    def waiting_blocks(self) -> int:
        """Blocks the waiting sequences would hold."""
        return self.count_waiting_blocks()


class Engine(BlockingCalls):
    def __init__(self, spec: ModelSpec | str, config: EngineConfig | None = None, *,
                 loaded: LoadedModel | None = None, num_blocks: int | None = None,
                 kv: KVAllocation | None = None, executor: Executor | None = None) -> None:
        """`kv`: KV memory handed over by an owner (an elastic pool) instead of allocated
        here; `num_blocks` is then the most blocks the pool could ever give this engine.
        `executor`: a device side built by the owner (a runtime's pipeline stages, shared
        by its two engines) instead of one built here."""
        spec = ModelSpec(spec) if isinstance(spec, str) else spec
        self.spec = spec
        self.config = config or EngineConfig()
        self.device = resolve_device(self.config.device)
        # A model loaded by the caller runs in the dtype it was loaded in, whatever `auto` says.
        self.dtype = loaded.dtype if loaded is not None else resolve_dtype(spec.dtype, self.device)
        self.loaded = loaded or load_model(spec.model, self.dtype, self.device)
        self.model, self.arch, self.tokenizer = self.loaded.model, self.loaded.arch, self.loaded.tokenizer
        cache = self.config.cache
        self.block_size = cache.block_size
        if kv is not None:
            self.num_blocks = kv.num_blocks
        else:
            self.num_blocks = num_blocks or cache.num_blocks or self._blocks_for_bytes(cache.kv_cache_bytes)
        if self.num_blocks < 1:
            raise ConfigError(f"KV cache budget holds no block of {self.block_size} tokens for "
                              f"{spec.model}; raise the KV memory budget")
        self.blocks = BlockManager(self.num_blocks, self.block_size, cache.enable_prefix_caching,
                                   usable_blocks=kv.usable if kv is not None else None,
                                   reuse_partial_blocks=cache.reuse_partial_blocks)
        self.executor = executor or build_executor(self.loaded, self.config, self.num_blocks, kv)
        # Only an executor that fills a placeholder input from its previous forward's sampled
        # tokens declares `fills_placeholders` (the sim); with the others the engine stays synchronous.
        self.async_scheduling = (self.config.scheduler.async_scheduling
                                 and getattr(self.executor, "fills_placeholders", False))
        self.scheduler = Scheduler(self.config.scheduler, self.blocks, self.config.parallel.pp_size,
                                   ahead=self.async_scheduling, max_model_len=self.max_model_len)
        self.host_kv = TieredKV.attach(self.blocks, self.executor, cache,
                                       bytes_per_block(self.arch, self.block_size, self.dtype))
        self._in_flight: deque[_Microbatch] = deque()
        # Async scheduling: each sampled sequence of the last launched microbatch -> its plan row.
        self._last_plan_rows: dict[Sequence, int] = {}
        self._microbatches = 0
        self.stats = EngineStats()
        # Time with a forward of this engine in flight (launch to result), for busy fractions.
        self.busy = BusyClock()
        self.host_times = HostTimes()  # host seconds per phase of a step
        self._groups: dict[str, RequestGroup] = {}
        self._aborted: list[RequestGroup] = []  # aborted, some sequence still in a microbatch
        self._seq_ids = itertools.count()
        self._generator = torch.Generator(device=self.device).manual_seed(self.config.seed)
        self.eos_token_ids = set(self.arch.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)

    def _blocks_for_bytes(self, budget: int | None) -> int:
        budget = DEFAULT_CPU_KV_BYTES if budget is None else budget
        return budget // bytes_per_block(self.arch, self.block_size, self.dtype)

    @property
    def max_model_len(self) -> int:
        return self.arch.max_position_embeddings

    def snapshot(self) -> dict:
        """Counters for reports: engine stats plus prefix-cache and pool occupancy."""
        blocks = self.blocks.stats
        return {
            **self.stats.as_dict(),
            "prefix_queries": blocks.prefix_queries, "prefix_hits": blocks.prefix_hits,
            "prefix_hit_rate": blocks.prefix_hits / blocks.prefix_queries if blocks.prefix_queries else 0.0,
            "host_hits": blocks.host_hits,
            "evictions": blocks.evictions, "preemptions": self.scheduler.num_preemptions,
            "blocks_total": self.num_blocks, "blocks_in_use": self.blocks.num_used_blocks,
            "blocks_cached_free": self.blocks.num_cached_free_blocks, "blocks_free": self.blocks.num_free_blocks,
        }

    def capture_score_graphs(self) -> None:
        """Captures the executor's score graphs for every padded size now (a PRM, before it
        serves); executors without them (CPU, pipeline stages, the simulated device) have none."""
        capture = getattr(self.executor, "capture_score_graphs", None)
        if capture is not None:
            capture()

    def add_block_listener(self, listener: BlockEventListener) -> None:
        self.blocks.listeners.append(listener)

    @property
    def block_pool(self) -> BlockManager:
        """The block ids an owner of this engine's KV memory (an elastic pool) adds and removes."""
        return self.blocks

    def block_counts(self) -> BlockCounts:
        blocks = self.blocks
        return BlockCounts(blocks.num_usable_blocks, blocks.num_used_blocks, blocks.num_cached_free_blocks,
                           blocks.num_free_blocks)

    def pressure(self) -> EnginePressure:
        scheduler, blocks = self.scheduler, self.blocks
        return EnginePressure(
            has_work=scheduler.has_work, owned_blocks=blocks.num_usable_blocks,
            free_blocks=blocks.num_free_blocks, blocks_to_progress=scheduler.blocks_to_progress(),
            preemptions=scheduler.num_preemptions, admission_stalls=scheduler.num_admission_stalls,
            count_waiting_blocks=scheduler.num_waiting_blocks)

    def yield_memory(self) -> None:
        """Preempt every running sequence (by recompute) so all its blocks are free to move."""
        self.scheduler.preempt_all()

    # -- requests --------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise RequestError(f"{self.spec.model} has no tokenizer (dummy weights): pass token ids")
            return self.tokenizer(prompt)["input_ids"]
        return list(prompt)

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | ScoreParams) -> None:
        if request_id in self._groups:
            raise RequestError(f"duplicate request id '{request_id}'")
        token_ids = self.tokenize(prompt)
        self._validate(token_ids, params)
        group = RequestGroup(request_id, token_ids, params)
        seq = self._new_sequence(group, list(token_ids), 0)
        self._groups[request_id] = group
        self.scheduler.add(seq)

    def _validate(self, token_ids: list[int], params: SamplingParams | ScoreParams) -> None:
        validate_request(token_ids, params, self.arch.vocab_size, self.max_model_len, self.spec.model)
        if isinstance(params, ScoreParams):
            needed = len(token_ids)
        else:
            needed = min(len(token_ids) + params.max_tokens, self.max_model_len)
        if -(-needed // self.block_size) > self.num_blocks:
            raise RequestError(
                f"KV cache too small for one sequence: {needed} tokens need "
                f"{-(-needed // self.block_size)} blocks, the pool has {self.num_blocks}; "
                "raise the KV memory budget (--device-memory / --kv-cache-memory)")

    def _new_sequence(self, group: RequestGroup, token_ids: list[int], index: int) -> Sequence:
        params = group.params
        seq = Sequence(next(self._seq_ids), group, token_ids, index=index)
        if isinstance(params, SamplingParams):
            seq.seed = child_seed(params.seed, params.first_child + index)
            if params.stop and self.tokenizer is not None:
                seq.detokenizer = IncrementalDetokenizer(self.tokenizer)
        group.sequences.append(seq)
        return seq

    def abort_request(self, request_id: str) -> int:
        """Drop a request its caller no longer wants (discarded speculation): it returns no
        output and its blocks are freed (full ones stay in the prefix cache). A sequence that
        a pipeline microbatch still holds is stopped when that microbatch returns. Returns
        the tokens it had generated."""
        group = self._groups.pop(request_id, None)
        if group is None:
            return 0
        self._count_prompt(group)
        group.aborted = True
        self._aborted.append(group)
        self._stop_aborted()
        return sum(len(seq.output_token_ids) for seq in group.sequences)

    def _stop_aborted(self) -> None:
        for group in [g for g in self._aborted if not any(seq.in_flight for seq in g.sequences)]:
            for seq in group.sequences:
                if seq.status is not SequenceStatus.FINISHED:
                    if seq in self.scheduler.waiting:
                        self.scheduler.waiting.remove(seq)
                    self.scheduler.finish(seq)
            self._aborted.remove(group)

    def has_unfinished_requests(self) -> bool:
        return bool(self._groups)

    def request_sequences(self, request_id: str) -> list[Sequence]:
        """The sequences of an unfinished request: one, or its `n` children once forked."""
        return list(self._groups[request_id].sequences)

    @property
    def num_unfinished_sequences(self) -> int:
        """Sequences still to finish, counting the children a request has yet to fork."""
        return sum(1 if group.is_score else
                   group.params.n - sum(s.status is SequenceStatus.FINISHED for s in group.sequences)
                   for group in self._groups.values())

    def pending_prefill_tokens(self) -> int:
        """Prompt tokens still to compute that the prefix cache will not serve."""
        return self.scheduler.num_uncached_prefill_tokens()

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def oldest_in_flight(self) -> Future[ModelOutput] | None:
        """The result `collect` waits for next (None: nothing in flight)."""
        return self._in_flight[0].future if self._in_flight else None

    # -- one iteration ---------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Launch microbatches while the executor has room (a pipeline keeps up to pp in
        flight, each on sequences no other in-flight microbatch holds), then complete the
        oldest one."""
        self.launch()
        if not self._in_flight:
            if self.scheduler.has_work:
                raise RuntimeError("scheduler made no progress with requests pending")
            return []
        return self.collect()

    def launch(self, limit: int | None = None) -> int:
        """Launch up to `limit` microbatches (None: while the executor has room) and return
        how many, waiting on none: a runtime overlapping two engines launches both, then
        collects."""
        self.blocks.step = self.stats.steps
        launched = 0
        depth = self.executor.depth + (1 if self.async_scheduling else 0)
        while (limit is None or launched < limit) and len(self._in_flight) < depth \
                and self.executor.can_launch():
            # The async slot is for decodes going ahead: a second microbatch of new work alone
            # would only split batches (a PRM forward costs the same full or not).
            if len(self._in_flight) >= self.executor.depth and not self.scheduler.ahead_decodes():
                break
            started = time.perf_counter()
            batch = self.scheduler.schedule(self._microbatches)
            started = self.host_times.add("schedule", started)
            if self.host_kv is not None:  # even with nothing to run: no copy waits across steps
                self.host_kv.before_forward()
            if batch.empty:
                break
            self._submit(batch, started)
            launched += 1
        return launched

    def _submit(self, batch: ScheduledBatch, started: float) -> None:
        """Builds the batch's inputs, hands them to the executor without waiting, and books
        the launch; `started` is when scheduling ended."""
        self._microbatches += 1
        model_input, layout = build_model_input(batch, self.block_size, self.device)
        plan = self._sample_plan(layout.sample_seqs)
        if self.async_scheduling:
            self._fill_from_previous(plan, layout.sample_seqs)
        for seq, _ in layout.chunks:
            seq.in_flight += 1
        started = self.host_times.add("build_inputs", started)
        self.busy.start()
        launched_at = time.perf_counter()
        future = self.executor.submit(model_input, plan if self.executor.samples else None)
        future.add_done_callback(self.busy.stop)  # before the prefetch: a local forward is done already
        microbatch = _Microbatch(layout, plan, future, len(batch.decodes),
                                 batch.num_tokens - len(batch.decodes), launched_at)
        future.add_done_callback(microbatch.finish)
        if self.host_kv is not None:
            self.host_kv.after_launch()
            if self.host_kv.prefetch and self.scheduler.prefetch():  # for the next step, while this forward runs
                self.host_kv.copy_prefetched()
        self._in_flight.append(microbatch)
        self._count_launch(batch)
        self.host_times.add("launch", started)

    def _count_launch(self, batch: ScheduledBatch) -> None:
        self.stats.steps += 1
        self.stats.computed_tokens += batch.num_tokens
        self.stats.microbatch_tokens.append(batch.num_tokens)
        self.stats.in_flight_at_launch.append(len(self._in_flight))
        self.stats.batch_seqs.append(len(batch.decodes) + len(batch.prefills))
        if batch.decodes:
            self.stats.decode_batch_sizes.append(len(batch.decodes))

    def collect(self) -> list[RequestOutput]:
        """Wait for the oldest microbatch in flight and process its results."""
        microbatch = self._in_flight.popleft()
        started = time.perf_counter()
        output = microbatch.future.result()
        started = self.host_times.add("wait", started)
        self.stats.forward_costs = self.stats.forward_costs.add(
            microbatch.decodes, microbatch.prefill_tokens, microbatch.finished_at - microbatch.launched_at)
        for seq, _ in microbatch.layout.chunks:
            seq.in_flight -= 1
        layout = microbatch.layout
        if self.async_scheduling:
            layout, output = self._drop_ended(layout, output)
        finished = self._process(layout, output, microbatch.plan)
        self._stop_aborted()
        self.host_times.add("process", started)
        return finished

    def _fill_from_previous(self, plan: SamplePlan, seqs: list[Sequence]) -> None:
        """Decodes going ahead (in flight already) read the token their microbatch in flight
        samples: their rows count it (the executor sets it as the row's `filled_token`, on its
        own thread) and point at the previous plan's row."""
        previous = self._last_plan_rows
        for row, seq in enumerate(seqs):
            if seq.in_flight:
                plan.rows[row].num_tokens += 1
                plan.filled_from.append((row, previous[seq]))
        self._last_plan_rows = {seq: row for row, seq in enumerate(seqs)}

    @staticmethod
    def _drop_ended(layout: BatchLayout, output: ModelOutput) -> tuple[BatchLayout, ModelOutput]:
        """Without the sequences that ended (or were aborted and stopped) after this microbatch
        was launched ahead of their last one: their token here follows their end."""
        if all(seq.status is not SequenceStatus.FINISHED for seq, _ in layout.chunks):
            return layout, output
        kept = [row for row, seq in enumerate(layout.sample_seqs) if seq.status is not SequenceStatus.FINISHED]
        tokens = output.sampled_tokens
        forks = tokens[len(layout.sample_seqs):]  # a forking prompt's children: never ahead
        layout = BatchLayout([layout.sample_seqs[row] for row in kept], layout.score_targets,
                             [(seq, n) for seq, n in layout.chunks if seq.status is not SequenceStatus.FINISHED])
        return layout, ModelOutput(output.sample_logits, output.score_logits, [tokens[row] for row in kept] + forks)

    def _sample_plan(self, seqs: list[Sequence]) -> SamplePlan:
        """A row per sampled sequence, then, for each prompt that forks (n > 1), a row per
        extra child over the parent's logits row."""
        plan = SamplePlan([], [])
        for row, seq in enumerate(seqs):
            plan.logit_rows.append(row)
            plan.rows.append(SamplingRow(seq.group.params, seq.token_ids, seq.num_prompt_tokens, seq.seed,
                                         seq.num_tokens))
        for row, seq in enumerate(seqs):
            if self._forks(seq):
                params = seq.group.params
                for index in range(1, params.n):
                    plan.logit_rows.append(row)
                    plan.rows.append(SamplingRow(params, seq.token_ids, seq.num_prompt_tokens,
                                                 child_seed(params.seed, params.first_child + index), seq.num_tokens))
        return plan

    @staticmethod
    def _forks(seq: Sequence) -> bool:
        return (seq.num_tokens == seq.num_prompt_tokens and seq.group.params.n > 1
                and len(seq.group.sequences) == 1)

    def _process(self, layout: BatchLayout, output: ModelOutput, plan: SamplePlan) -> list[RequestOutput]:
        for seq, n in layout.chunks:
            seq.num_computed_tokens += n
            self._register_full_blocks(seq)
        for targets, logits in zip(layout.score_targets, output.score_logits):
            self._record_scores(targets, logits)
        if layout.sample_seqs:
            tokens = output.sampled_tokens
            if tokens is None:
                logits = output.sample_logits
                rows = logits if len(plan.logit_rows) == len(layout.sample_seqs) else logits[plan.logit_rows]
                tokens = sample(rows, plan.rows, self._generator)
            self._apply_samples(layout.sample_seqs, tokens)
        finished = []
        for seq, _ in layout.chunks:
            group = seq.group
            if group.is_score and seq.num_computed_tokens == seq.num_tokens:
                self.scheduler.finish(seq)
            if group.request_id in self._groups and group.finished:
                finished.append(self._finish_group(group))
        return finished

    def _register_full_blocks(self, seq: Sequence) -> None:
        bs = self.block_size
        full = seq.num_computed_tokens // bs
        while len(seq.block_hashes) < full:
            k = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else ROOT_HASH
            tokens = tuple(seq.token_ids[k * bs:(k + 1) * bs])
            seq.block_hashes.append(self.blocks.register_full_block(seq.block_table[k], parent, tokens))

    def _record_scores(self, targets: list[tuple[Sequence, int]], logits: torch.Tensor) -> None:
        values = logits.float()
        # One conversion of the rows each target reads, not both matrices (a PRM step
        # carries hundreds of rows).
        wants_logits = [seq.group.params.return_logits for seq, _ in targets]
        logit_rows = values.tolist() if any(wants_logits) else None
        prob_rows = None if all(wants_logits) else values.softmax(dim=-1).tolist()
        for row, ((seq, position), want_logits) in enumerate(zip(targets, wants_logits)):
            seq.group.score_rows[position] = logit_rows[row] if want_logits else prob_rows[row]
        self.stats.scored_positions += len(targets)

    def _apply_samples(self, seqs: list[Sequence], tokens: list[int]) -> None:
        """`tokens` in `_sample_plan`'s order: one per sequence, then the forks' children."""
        children = iter(tokens[len(seqs):])
        for seq in seqs:
            if self._forks(seq):
                self._fork(seq, [next(children) for _ in range(1, seq.group.params.n)])
        for seq, token in zip(seqs, tokens):
            self._append_token(seq, token)

    def _fork(self, parent: Sequence, first_tokens: list[int]) -> None:
        """n > 1: children share the prompt's full blocks; each has sampled its own first token.
        With partial-block reuse each child also gets a device copy of the prompt's partial
        last block (when a block is free), so its first token is a decode instead of a
        recompute of that block."""
        group = parent.group
        bs = self.block_size
        shared = parent.block_table[: parent.num_prompt_tokens // bs]
        partial = parent.block_table[len(shared)] if parent.num_prompt_tokens % bs else None
        for index, token in enumerate(first_tokens, start=1):
            child = self._new_sequence(group, list(parent.token_ids), index)
            self.blocks.share(shared)
            child.block_table = list(shared)
            child.block_hashes = list(parent.block_hashes[: len(shared)])
            child.num_computed_tokens = len(shared) * bs
            copy = self.blocks.allocate(1) if partial is not None and self.blocks.reuse_partial_blocks else None
            if copy is not None:
                self.scheduler.copy_block(partial, copy[0])
                child.block_table.append(copy[0])
                child.num_computed_tokens = parent.num_prompt_tokens
            child.status = SequenceStatus.RUNNING
            self.scheduler.running.append(child)
            self._append_token(child, token)

    def _append_token(self, seq: Sequence, token: int) -> None:
        params: SamplingParams = seq.group.params
        seq.token_ids.append(token)
        self.stats.generated_tokens += 1
        num_output = seq.num_tokens - seq.num_prompt_tokens
        reason = None
        if token in self.eos_token_ids and not params.ignore_eos:
            seq.token_ids.pop()  # EOS ends the sequence; it is not part of the output
            reason = "eos"
        elif token in params.stop_token_ids:
            reason = "stop"
        elif seq.detokenizer is not None:
            started = time.perf_counter()
            seq.detokenizer.append(token)
            self.host_times.add("detokenize", started)
            if self._hit_stop_string(seq, params):
                reason = "stop"
        if reason is None and (num_output >= params.max_tokens or seq.num_tokens >= self.max_model_len):
            reason = "length"
        if reason is not None:
            seq.finish_reason = reason
            self.scheduler.finish(seq)

    def _hit_stop_string(self, seq: Sequence, params: SamplingParams) -> bool:
        text = seq.detokenizer.text
        for stop in params.stop:
            at = text.find(stop)
            if at >= 0:
                seq.detokenizer.text = text[: at + len(stop)] if params.include_stop_str_in_output else text[:at]
                return True
        return False

    def _count_prompt(self, group: RequestGroup) -> None:
        """Prompt and cached tokens, counted together as the request leaves the engine, and
        only if the prefix cache was asked for its prompt: a discarded speculation aborted
        before it was scheduled never was, and counting its prompt alone would make the
        hit rate look lower than it is."""
        if group.prompt_looked_up:
            self.stats.prompt_tokens += group.num_prompt_tokens
            self.stats.cached_prompt_tokens += group.num_cached_prompt_tokens

    def _finish_group(self, group: RequestGroup) -> RequestOutput:
        del self._groups[group.request_id]
        self._count_prompt(group)
        out = RequestOutput(group.request_id, group.prompt_token_ids,
                            num_cached_prompt_tokens=group.num_cached_prompt_tokens)
        if group.is_score:
            out.scores = [group.score_rows[p] for p in group.params.positions]
            return out
        for seq in sorted(group.sequences, key=lambda s: s.index):
            ids = seq.output_token_ids
            text = seq.detokenizer.text if seq.detokenizer is not None else self._decode(ids)
            out.completions.append(CompletionOutput(seq.index, ids, text, seq.finish_reason))
        return out

    def _decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def shutdown(self) -> None:
        if self.host_kv is not None:
            self.host_kv.finish()
        self.executor.shutdown()
