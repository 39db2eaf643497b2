"""A pipeline stage process: its layer slice of every co-hosted model, KV for those layers,
on its device (the CPU, or its GPU: stage_placement.py).

Per microbatch, in launch order: take the schedule (sent by the driver to every stage at
launch), get the input activations (the first stage embeds the token ids; the others
receive the previous stage's, activation_link.py), run the slice, then hand the
activations on, or, on the last stage, compute only the needed logits rows (and candidate
columns for scores), sample them if asked, and return them to the driver.

SiPipe's techniques, each switchable (ParallelConfig):
* token-safe execution: a preparing thread copies microbatch i+1's schedule into the input
  buffers of its parity while microbatch i computes; a buffer is refilled only after the
  microbatch that used it has finished here (one semaphore per parity). On a GPU with
  CUDA graphs on, each parity has its own decode graphs over its own static buffers
  (stage_graphs.py), and decode-only microbatches replay them;
* structure-aware transmission: the receiver sizes the activation from the schedule it
  already holds, so the sender writes the slot and sends only a ready signal (off: the
  activation travels as a message carrying its shape);
* sampling off the last stage: driver-side by default; off, the last stage samples.

No loop spins: every wait, receive or send, is a blocking poll with a timeout that checks
the driver is alive (wire.send, wire.receive). Messages are wire.py's schema'd msgpack.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace

import torch
import zmq

from tts_runtime.executor.attention.backends import backend_for
from tts_runtime.executor.batch import ModelInput, ModelOutput
from tts_runtime.executor.kv_cache import allocate_kv_cache, copy_blocks
from tts_runtime.executor.layer_ops import layer_ops
from tts_runtime.executor.local import compute_output_logits, output_rows
from tts_runtime.executor.pipeline import wire
from tts_runtime.executor.pipeline.activation_link import ActivationLink, DistributedLink, SharedMemoryLink
from tts_runtime.executor.pipeline.stage_graphs import StageGraphs
from tts_runtime.executor.sampler import sample
from tts_runtime.executor.pipeline.stage_messages import (Launch, Ready, Shutdown, StageFailure, StageModelSetup,
                                                          StageResult, StageSetup, TraceDump, TraceRequest)
from tts_runtime.models.decoder import ModelPart
from tts_runtime.models.loader import load_model

_POLL_MS = 200
_PR_SET_PDEATHSIG = 1


@dataclass
class _StageModel:
    model: torch.nn.Module
    layers: range
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    hidden_size: int
    dtype: torch.dtype
    num_blocks: int


def _die_with_parent(parent_pid: int) -> None:
    """The kernel kills this process when the driver dies (Linux); the poll loops also
    check the parent, for the window before prctl and for other systems."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass
    if os.getppid() != parent_pid:
        sys.exit(0)


def _exit_without_parent(parent_pid: int) -> None:
    if os.getppid() != parent_pid:
        sys.exit(0)


@dataclass
class _Prepared:
    """A control message ready to run: a launch's inputs sit in the buffers of `version`,
    in a decode graph's static buffers when `padded` is set."""

    message: object
    version: int | None = None
    padded: int | None = None


class _InputBuffers:
    """One version of a stage's input tensors, on its device; a batch is copied in and read as views."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._store: dict[str, torch.Tensor] = {}

    def _hold(self, name: str, value: torch.Tensor) -> torch.Tensor:
        held = self._store.get(name)
        if held is None or held.dtype != value.dtype or held.numel() < value.numel():
            held = torch.empty(max(value.numel(), 1) * 2, dtype=value.dtype, device=self.device)
            self._store[name] = held
        view = held[: value.numel()].view(value.shape)
        view.copy_(value)
        return view

    def fill(self, batch: ModelInput) -> ModelInput:
        meta = batch.meta
        held_meta = replace(meta, slot_mapping=self._hold("slots", meta.slot_mapping),
                            decode_block_tables=self._hold("decode_tables", meta.decode_block_tables),
                            decode_context_lens=self._hold("decode_lens", meta.decode_context_lens),
                            prefill_block_tables=self._hold("prefill_tables", meta.prefill_block_tables))
        return replace(batch, input_ids=self._hold("ids", batch.input_ids),
                       positions=self._hold("positions", batch.positions), meta=held_meta)


class StageWorker:
    def __init__(self, setup: StageSetup) -> None:
        self.setup = setup
        parallel = setup.config.parallel
        self.context = zmq.Context()
        self.control = self.context.socket(zmq.PULL)
        self.control.connect(setup.control_address)
        self.results = self.context.socket(zmq.PUSH)
        self.results.connect(setup.result_address)
        self.device = device = torch.device(setup.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.link = self._link(setup)
        self.models = {spec.key: self._load(spec) for spec in setup.models}
        self.backend = backend_for(setup.config, device)
        self.ops = layer_ops(device, setup.config, [m.model for m in self.models.values()])
        graphed = device.type == "cuda" and setup.config.cuda_graphs and self.backend.name == "triton"
        self.graphs = self._capture_graphs() if graphed else {}
        self.generator = torch.Generator().manual_seed(setup.config.seed)
        self.buffers = [_InputBuffers(device), _InputBuffers(device)]
        self.free_versions = [threading.Semaphore(1), threading.Semaphore(1)]
        self.prepared: queue.Queue = queue.Queue()  # _Prepared, or the exception that stopped preparing
        self.events: list[tuple[str, int, int, float, float]] = []
        self.token_safe = parallel.token_safe

    def _check_parent(self) -> None:
        _exit_without_parent(self.setup.parent_pid)

    def _send(self, message: object) -> None:
        wire.send(self.results, wire.encode(message), self._check_parent, _POLL_MS)

    def _receive_control(self) -> object:
        return wire.receive(self.control, self._check_parent, _POLL_MS)

    def _link(self, setup: StageSetup) -> ActivationLink:
        if setup.transport != "shm":
            return DistributedLink(setup, setup.startup_seconds)
        return SharedMemoryLink(setup, self.context, self._check_parent, _POLL_MS)

    def _load(self, spec: StageModelSetup) -> _StageModel:
        part = ModelPart(spec.layers, embedding=self.setup.is_first, head=self.setup.is_last)
        loaded = load_model(spec.model, spec.dtype, self.device, part)
        model = loaded.model
        own_layers = replace(loaded.arch, num_layers=len(spec.layers))  # KV for this stage's layers only
        cache = self.setup.config.cache
        caches = allocate_kv_cache(own_layers, spec.num_blocks, cache.block_size, spec.dtype, self.device,
                                   cache.lazy_kv_zeroing)
        return _StageModel(model, spec.layers, caches, loaded.arch.hidden_size, spec.dtype, spec.num_blocks)

    def _capture_graphs(self) -> dict[str, list[StageGraphs]]:
        """Per model, one set of decode graphs per input-buffer parity (token-safe execution)."""
        config = self.setup.config
        block_size = config.cache.block_size
        graphs = {}
        for key, m in self.models.items():
            max_blocks = min(-(-m.model.arch.max_position_embeddings // block_size), m.num_blocks)
            graphs[key] = [StageGraphs(m.model, m.layers, m.kv_caches, self.backend, self.ops,
                                       first=self.setup.is_first, max_num_seqs=config.scheduler.max_num_seqs,
                                       max_blocks_per_seq=max_blocks, block_size=block_size) for _ in range(2)]
        return graphs

    # -- preparing inputs (token-safe execution) -------------------------------------------
    def _prepare_loop(self) -> None:
        try:
            while True:
                message = self._receive_control()
                self.prepared.put(self._prepare(message))
                if isinstance(message, Shutdown):
                    return
        except Exception as error:  # raised again by the main loop, which reports it
            self.prepared.put(error)

    def _prepare(self, message) -> _Prepared:
        if not isinstance(message, Launch):
            return _Prepared(message)
        version = message.microbatch % 2
        self.free_versions[version].acquire()  # the microbatch that used it has finished here
        start = time.perf_counter()
        graphs = self.graphs.get(message.model)
        padded = graphs[version].prepare(message.batch) if graphs else None
        if padded is None:
            message = replace(message, batch=self.buffers[version].fill(message.batch))
        self.events.append(("prepare", message.microbatch, version, start, time.perf_counter()))
        return _Prepared(message, version, padded)

    def _next(self) -> _Prepared:
        if self.token_safe:
            while True:
                try:
                    prepared = self.prepared.get(timeout=_POLL_MS / 1000)
                except queue.Empty:
                    self._check_parent()
                    continue
                if isinstance(prepared, Exception):
                    raise prepared
                return prepared
        return self._prepare(self._receive_control())

    # -- running microbatches ---------------------------------------------------------------
    def run(self) -> None:
        self._send(Ready(self.setup.stage, os.getpid()))
        if self.token_safe:
            threading.Thread(target=self._prepare_loop, daemon=True).start()
        while True:
            prepared = self._next()
            message, version = prepared.message, prepared.version
            if isinstance(message, Shutdown):
                self.link.close()
                return
            if isinstance(message, TraceRequest):
                self._send(TraceDump(self.setup.stage, list(self.events)))
                continue
            try:
                self._run_microbatch(message, version, prepared.padded)
            finally:
                self.free_versions[version].release()

    @torch.inference_mode()
    def _run_microbatch(self, launch: Launch, version: int, padded: int | None) -> None:
        """`padded`: the size of the decode graph whose buffers hold this batch (None: eager)."""
        stage_model = self.models[launch.model]
        batch = launch.batch
        if batch.block_copies is not None:
            copy_blocks(stage_model.kv_caches, batch.block_copies)
        wait = time.perf_counter()
        if not self.setup.is_first:
            hidden = self.link.receive(launch.microbatch, batch.input_ids.shape[0], stage_model.hidden_size,
                                       stage_model.dtype)
        elif padded is None:
            hidden = stage_model.model.embed(batch.input_ids)
        else:
            hidden = None  # the graph embeds
        start = time.perf_counter()
        self.events.append(("wait", launch.microbatch, version, wait, start))
        rows = None
        if padded is not None:
            hidden = self.graphs[launch.model][version].replay(padded, batch.input_ids.shape[0], hidden)
        else:
            if self.setup.is_last and self.setup.config.prune_last_layer:
                rows = output_rows(batch)
            hidden = stage_model.model.run_layers(hidden, batch.positions, stage_model.kv_caches, batch.meta,
                                                  self.backend, self.ops, stage_model.layers, rows)
        if self.setup.is_last:
            self._send(StageResult(launch.microbatch, self._output(stage_model, hidden, launch, rows)))
        else:
            self.link.send(launch.microbatch, hidden)
        self.events.append(("compute", launch.microbatch, version, start, time.perf_counter()))

    def _output(self, stage_model: _StageModel, hidden: torch.Tensor, launch: Launch,
                rows: torch.Tensor | None) -> ModelOutput:
        model = stage_model.model
        output = compute_output_logits(model, model.norm(hidden, self.ops), launch.batch, self.ops, rows)
        scores = [logits.cpu() for logits in output.score_logits]  # no-ops on a CPU stage
        plan = launch.sample_plan
        if plan is None:
            return ModelOutput(output.sample_logits.cpu(), scores)
        logits = output.sample_logits[plan.logit_rows] if plan.logit_rows else output.sample_logits
        tokens = sample(logits, plan.rows, self.generator) if plan.rows else []
        return ModelOutput(output.sample_logits[:0].cpu(), scores, tokens)

def stage_main(setup: StageSetup) -> None:
    """Entry point of a spawned stage process."""
    _die_with_parent(setup.parent_pid)
    torch.set_num_threads(setup.threads)
    worker = None
    try:
        worker = StageWorker(setup)
        worker.run()
    except SystemExit:
        raise
    except BaseException:
        context = zmq.Context.instance()
        report = context.socket(zmq.PUSH)
        report.setsockopt(zmq.LINGER, 2000)
        report.connect(setup.result_address)
        report.send_multipart(wire.encode(StageFailure(setup.stage, os.getpid(), traceback.format_exc())))
        report.close()
        sys.exit(1)
