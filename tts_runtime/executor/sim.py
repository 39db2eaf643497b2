"""A simulated device (`--device sim`, `sim:COSTS.json`): forwards that run no math and take
the time a cost model gives, so that everything else (scheduler, block manager, prefix cache,
batch builder, detokenizer, search, grading) runs for real against a device as fast as a GPU,
and the host's share of a run can be measured on a machine without one.

Forwards queue behind each other as on one GPU stream: a forward submitted at `now` finishes
at max(now, the previous forward's finish) + its cost, on one device shared by every engine of
the process (the co-hosted pair shares its GPU). A device thread sleeps until each finish time
and resolves the future then: waiting holds neither the GIL nor a core. The generator's
tokens are drawn by the executor (`samples = True`) from a token source; the PRM's score
logits from a normal draw seeded by what is scored (below), so that a search's scores, like its
tokens, do not depend on what else shares a batch and two runs of one search do the same work.

Async scheduling: the engine may submit a decode whose input token is the one the previous
forward samples (`SamplePlan.filled_from`). The device thread runs each executor's forwards
in submission order, so that token is drawn, on the device side, before the forward that
reads it, as a GPU's sampled-token buffer is written by the kernel before the next one.
"""

from __future__ import annotations

import math
import os
import queue
import select
import threading
from bisect import bisect_right
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch

from tts_runtime.config import ConfigError
from tts_runtime.executor.batch import ModelInput, ModelOutput, SamplePlan
from tts_runtime.executor.sim_costs import SimCosts
from tts_runtime.executor.sim_profile import load_profile
from tts_runtime.executor.sim_tokens import ProfileTokens, TokenSource, mix_uniform

SIM = "sim"


def is_sim_device(device: str) -> bool:
    return device == SIM or device.startswith(SIM + ":")


def sim_costs_for(device: str) -> SimCosts:
    """`sim`: the H100 defaults; `sim:FILE`: the fits in FILE."""
    if not device.startswith(SIM + ":"):
        return SimCosts()
    path = Path(device[len(SIM) + 1:])
    try:
        return SimCosts.from_file(path)
    except (OSError, ValueError, TypeError) as err:
        raise ConfigError(f"--device {device}: cannot read the cost file ({err}); write it with "
                          "`tts bench cohost` on a real device, or pass sim for the H100 defaults") from None


@dataclass
class _Forward:
    finish_at: float
    future: Future[ModelOutput]
    compute: Callable[[], ModelOutput]  # run on the device thread as the forward arrives


class SimDevice:
    """One stream: forwards finish in submission order, each `cost` after the later of its
    submission and the previous finish.

    The device thread waits in `select` on a pipe that each submission writes a byte to, with
    a relative timeout, not in a timed lock acquire: three benchmark runs stalled for minutes
    with this thread inside `SimpleQueue.get(timeout=~30 us)` and a forward due (never
    reproduced in isolation; see docs/benchmarks/host_lean_3.md)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[_Forward] = queue.SimpleQueue()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        self._lock = threading.Lock()
        self._free_at = 0.0
        self.busy_seconds = 0.0  # the sum of the forwards' costs: the run's device-time ceiling
        self._thread = threading.Thread(target=self._run, name="sim-device", daemon=True)
        self._thread.start()

    def submit(self, cost: float, compute: Callable[[], ModelOutput]) -> Future[ModelOutput]:
        future: Future[ModelOutput] = Future()
        with self._lock:
            self._free_at = max(time.perf_counter(), self._free_at) + cost
            self.busy_seconds += cost
            self._queue.put(_Forward(self._free_at, future, compute))
        os.write(self._wake_write, b"\0")
        return future

    def _run(self) -> None:
        """Computes each forward's output as it arrives, while the forwards before it are
        still running, and resolves it at its finish time. The output (drawn tokens, score
        logits) is the sim's own Python, holding the GIL: computed after the previous
        forward's result, as the engine wakes to process it, it held the engine up (its
        wait on a result ran 226 us past the finish time, median, and 863 us at the 90th
        percentile, ~10% of a 20-problem run), time a GPU, which samples on the device,
        does not charge the host."""
        due: deque[tuple[_Forward, ModelOutput]] = deque()
        while True:
            timeout = max(0.0, due[0][0].finish_at - time.perf_counter()) if due else None
            select.select([self._wake_read], [], [], timeout)
            try:
                os.read(self._wake_read, 4096)
            except BlockingIOError:  # woken by the timeout
                pass
            while True:  # after the pipe: a forward whose byte was drained is in the queue
                try:
                    forward = self._queue.get_nowait()
                except queue.Empty:
                    break
                try:
                    due.append((forward, forward.compute()))
                except BaseException as exc:  # the engine sees it from future.result()
                    forward.future.set_exception(exc)
            now = time.perf_counter()
            while due and due[0][0].finish_at <= now:
                finished, output = due.popleft()
                finished.future.set_result(output)


_devices: dict[str, SimDevice] = {}
_devices_lock = threading.Lock()


def shared_device(device: str) -> SimDevice:
    """The process's simulated device of this name (both engines of a runtime share it)."""
    with _devices_lock:
        if device not in _devices:
            _devices[device] = SimDevice()
        return _devices[device]


class SimExecutor:
    """The executor interface of LocalExecutor with a simulated forward."""

    depth = 1
    samples = True  # the token source picks the tokens; no logits are made
    fills_placeholders = True  # async scheduling: see the module doc

    def __init__(self, device: SimDevice, costs: SimCosts, tokens: TokenSource, seed: int = 0) -> None:
        self.device = device
        self.costs = costs
        self.tokens = tokens
        self.seed = seed
        self._last_tokens: list[int] = []  # the previous forward's drawn tokens (device thread only)

    def can_launch(self) -> bool:
        return True

    def submit(self, batch: ModelInput, sample_plan: SamplePlan | None = None) -> Future[ModelOutput]:
        return self.device.submit(self.costs.seconds(batch), lambda: self._output(batch, sample_plan))

    def _output(self, batch: ModelInput, plan: SamplePlan | None) -> ModelOutput:
        tokens = []
        if plan is not None:
            for row, previous in plan.filled_from:
                plan.rows[row].filled_token = self._last_tokens[previous]
            tokens = [self.tokens.next_token(row) for row in plan.rows]
            self._last_tokens = tokens
        scores = self._score_logits(batch) if batch.score_rows else []
        return ModelOutput(torch.empty(0), scores, tokens)

    def _score_logits(self, batch: ModelInput) -> list[torch.Tensor]:
        """Per scored row, normal logits seeded by its position and its tokens from the start of
        its KV block or of its chunk, if later. Its block is never served from the cache (the
        prefix cache serves whole blocks, and a score request takes no partial block that ends
        in the block of a scored position), so the seed does not depend on what was cached."""
        ids, positions, meta = batch.input_ids.tolist(), batch.positions.tolist(), batch.meta
        starts = meta.prefill_query_starts
        groups = []
        for rows, columns in batch.score_rows:
            values = []
            for row in rows.tolist():
                chunk = row if row < meta.num_decodes else starts[bisect_right(starts, row) - 1]
                first = max(chunk, row - positions[row] % meta.block_size)
                seed = hash((tuple(ids[first:row + 1]), positions[row], self.seed))
                values.append([_normal(seed, column) for column in range(len(columns))])
            groups.append(torch.tensor(values, dtype=torch.float32))
        return groups

    def shutdown(self) -> None:
        pass  # the device thread is shared and a daemon: it outlives any one engine


def _normal(seed: int, index: int) -> float:
    """A standard normal number from (seed, index) (Box-Muller on two seeded uniforms)."""
    u = 1.0 - mix_uniform(seed, index, 4)  # in (0, 1]: log is finite
    return math.sqrt(-2.0 * math.log(u)) * math.cos(2.0 * math.pi * mix_uniform(seed, index, 5))


def build_sim_executor(device: str, seed: int = 0, tokens: TokenSource | None = None) -> SimExecutor:
    return SimExecutor(shared_device(device), sim_costs_for(device),
                       tokens or ProfileTokens(load_profile(), seed), seed)
