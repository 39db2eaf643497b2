"""The device side of the host KV tier: a host copy of whole KV blocks, and the batched
copies between it and the device pool (engine/host_tier.py decides what moves where).

Host memory is one tensor [layers, 2 (K, V), slots, block_size, kv_heads, head_dim],
pinned on CUDA so host-to-device copies run asynchronously. One `apply` moves a step's
whole batch: swap-outs (device -> host) first, then swap-ins (host -> device), so a slot
or block written and read in the same batch is read after its write, and a block
evicted and refilled in the same batch is saved before it is overwritten. Per layer
that is one gather and one scatter each way, never a copy per block.

CPU: both tiers are DRAM and the copies run synchronously in the caller.
CUDA: the copies run on a copy stream. Before a forward (`overlap=False`) the compute
stream waits for them; a prefetch batch issued after a forward was launched
(`overlap=True`) runs beside it, and the next forward waits for it. Swap-outs end in a
host-side scatter, so they wait for their device-to-host copy (the forward launched
before a prefetch keeps running meanwhile). The share of copy time hidden behind
compute is measured from CUDA events: the overlap of the copy's interval with the
forward's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from tts_runtime.executor.kv_cache import KVCaches


@dataclass
class SwapPlan:
    out_blocks: list[int] = field(default_factory=list)  # device blocks to save ...
    out_slots: list[int] = field(default_factory=list)  # ... into these host slots
    in_slots: list[int] = field(default_factory=list)  # host slots to load ...
    in_blocks: list[int] = field(default_factory=list)  # ... into these device blocks
    overlap: bool = False  # a prefetch: may run beside the forward in flight

    @property
    def empty(self) -> bool:
        return not self.out_blocks and not self.in_blocks


@dataclass(frozen=True)
class SwapTiming:
    seconds: float  # copy time of one batch
    hidden_seconds: float  # of which overlapped a forward (0 on CPU: copies are synchronous)


@dataclass
class _Pending:
    """A CUDA batch whose events have not all completed yet."""

    start: torch.cuda.Event
    end: torch.cuda.Event
    host_seconds: float  # the swap-outs' host-side scatter
    compute: tuple[torch.cuda.Event, torch.cuda.Event] | None


class HostKVCache:
    def __init__(self, caches: KVCaches, num_slots: int) -> None:
        key = caches[0][0]
        self.caches = caches
        self.device = key.device
        self.cuda = self.device.type == "cuda"
        # Uninitialised: a slot is written before it is ever read, and on CPU untouched pages
        # cost no memory until the tier fills.
        self.host = torch.empty((len(caches), 2, num_slots, *key.shape[1:]), dtype=key.dtype, pin_memory=self.cuda)
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._pending: list[_Pending] = []
        self._compute: tuple[torch.cuda.Event, torch.cuda.Event] | None = None

    @property
    def num_slots(self) -> int:
        return self.host.shape[2]

    # -- compute markers (CUDA): the forward a prefetch batch may hide behind ----------
    def compute_started(self) -> None:
        if self.cuda:
            self._compute = (_event(torch.cuda.current_stream(self.device)), None)

    def compute_launched(self) -> None:
        if self.cuda and self._compute is not None:
            self._compute = (self._compute[0], _event(torch.cuda.current_stream(self.device)))

    # -- copies ----------------------------------------------------------------------
    @torch.inference_mode()
    def apply(self, plan: SwapPlan) -> list[SwapTiming]:
        """Run one batch of copies; returns the timings of every batch that has finished
        (on CUDA a batch's events may complete after a later call)."""
        if not plan.empty:
            if self.cuda:
                self._apply_cuda(plan)
            else:
                start = time.perf_counter()
                self._swap_out(plan, self.host)
                self._swap_in(plan, self.host.index_select(2, _ids(plan.in_slots)) if plan.in_slots else None)
                return self._drain() + [SwapTiming(time.perf_counter() - start, 0.0)]
        if self.cuda and not plan.overlap:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)  # the forward reads them
        return self._drain()

    def _swap_out(self, plan: SwapPlan, host: torch.Tensor) -> None:
        if not plan.out_blocks:
            return
        blocks, slots = _ids(plan.out_blocks, self.device), _ids(plan.out_slots)
        if not self.cuda:
            for layer, (k, v) in enumerate(self.caches):
                host[layer, 0].index_copy_(0, slots, k.index_select(0, blocks))
                host[layer, 1].index_copy_(0, slots, v.index_select(0, blocks))
            return
        gathered = torch.stack([torch.stack((k.index_select(0, blocks), v.index_select(0, blocks)))
                                for k, v in self.caches])
        staged = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
        staged.copy_(gathered, non_blocking=True)
        self.stream.synchronize()
        host.index_copy_(2, slots, staged)

    def _swap_in(self, plan: SwapPlan, staged: torch.Tensor | None) -> None:
        if staged is None:
            return
        blocks = _ids(plan.in_blocks, self.device)
        if self.cuda:
            staged = staged.to(self.device, non_blocking=True)
        for layer, (k, v) in enumerate(self.caches):
            k.index_copy_(0, blocks, staged[layer, 0])
            v.index_copy_(0, blocks, staged[layer, 1])

    def _apply_cuda(self, plan: SwapPlan) -> None:
        with torch.cuda.stream(self.stream):
            start = _event(self.stream)
            host_start = time.perf_counter()
            self._swap_out(plan, self.host)
            host_seconds = time.perf_counter() - host_start if plan.out_blocks else 0.0
            staged = None
            if plan.in_slots:
                staged = torch.empty((*self.host.shape[:2], len(plan.in_slots), *self.host.shape[3:]),
                                     dtype=self.host.dtype, pin_memory=True)
                torch.index_select(self.host, 2, _ids(plan.in_slots), out=staged)
            self._swap_in(plan, staged)
            end = _event(self.stream)
        compute = self._compute if plan.overlap and self._compute and self._compute[1] is not None else None
        self._pending.append(_Pending(start, end, host_seconds, compute))

    def _drain(self) -> list[SwapTiming]:
        done, waiting = [], []
        for item in self._pending:
            events = [item.end, *(item.compute or ())]
            if not all(e.query() for e in events):
                waiting.append(item)
                continue
            copy = item.start.elapsed_time(item.end) / 1000
            hidden = 0.0
            if item.compute is not None:
                # Both intervals measured from the copy's start, in seconds.
                c_start = item.start.elapsed_time(item.compute[0]) / 1000
                c_end = item.start.elapsed_time(item.compute[1]) / 1000
                hidden = max(0.0, min(copy, c_end) - max(0.0, c_start))
            done.append(SwapTiming(copy + item.host_seconds, hidden))
        self._pending = waiting
        return done

    def finish(self) -> list[SwapTiming]:
        """Wait for every batch in flight and return the timings not yet returned."""
        if self.stream is not None:
            self.stream.synchronize()
            torch.cuda.synchronize(self.device)
        return self._drain()


def _ids(values: list[int], device: torch.device | None = None) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def _event(stream: torch.cuda.Stream) -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)
    event.record(stream)
    return event
