"""The driver's side of pipeline parallelism: stage processes serving one or more models.

A `PipelineGroup` spawns `pp_size` stage processes (stage_worker.py), each holding its
layer slice of every model in the group (a runtime puts its generator and PRM in one
group) and KV for its own layers, with the same block ids as the driver's one block
table. Each engine talks to the group through a `PipelineExecutor`.

Launching a microbatch sends its schedule to every stage at once (so later stages prepare
early); the last stage sends the result back. At most `pp_size` microbatches are in flight
in the whole group: activation slot m mod pp is then never rewritten while in use.

Failures: a thread receives results and, between them, checks the stage processes; a
stage that dies fails every pending microbatch with a one-line `PipelineFailure` naming
the stage, its pid and the signal (within the poll interval), and the other stages are
stopped; an exception inside a stage arrives with the stage's traceback. Stages die with
the driver (see stage_worker.py). A send never waits on a dead stage: while a stage
cannot take a message, the same check runs every poll interval (wire.send).

The wire (wire.py): schema'd msgpack messages, never pickles, over ZeroMQ ipc:// sockets
in a fresh directory only this user can enter (mode 0700, removed at shutdown), so no
other local user can connect to a stage or to the driver. A message outside the schema
fails the pipeline with one line. The wait for the stages to start grows with the size of
the models they load (stage_messages.startup_seconds).
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial
from multiprocessing.process import BaseProcess
from pathlib import Path

import torch
import torch.multiprocessing as mp
import zmq

from tts_runtime.config import EngineConfig
from tts_runtime.executor.batch import ModelInput, ModelOutput, SamplePlan
from tts_runtime.executor.pipeline import wire
from tts_runtime.executor.pipeline.stage_messages import (Launch, Ready, Shutdown, StageFailure, StageModelSetup,
                                                          StageResult, StageSetup, TraceDump, TraceRequest,
                                                          startup_seconds)
from tts_runtime.executor.layer_costs import measure_stage_costs
from tts_runtime.executor.pipeline.stage_placement import resolved_transport, stage_devices
from tts_runtime.executor.pipeline.stage_split import stage_layers
from tts_runtime.executor.pipeline.stage_worker import stage_main
from tts_runtime.models.arch import ArchConfig
from tts_runtime.models.loader import LoadedModel

_POLL_MS = 100


class PipelineFailure(RuntimeError):
    """A stage died or raised; the message is one line naming the stage."""


@dataclass(frozen=True)
class StageModel:
    """A model the pipeline serves: what the stages load, and how many KV blocks it has."""

    key: str
    model: str
    dtype: torch.dtype
    num_blocks: int
    num_layers: int
    arch: ArchConfig
    samples_full_vocabulary: bool
    loaded: LoadedModel = field(repr=False, compare=False)  # the driver's copy: timed for the split

    @classmethod
    def of(cls, key: str, loaded: LoadedModel, num_blocks: int, samples_full_vocabulary: bool = True) -> StageModel:
        return cls(key, loaded.name, loaded.dtype, num_blocks, loaded.arch.num_layers,
                   loaded.arch, samples_full_vocabulary, loaded)


def _free_port() -> int:
    """A loopback port for torch.distributed's rendezvous (gloo / nccl transports only)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


class PipelineGroup:
    def __init__(self, models: list[StageModel], config: EngineConfig, name: str = "pipeline") -> None:
        """`name` starts every failure line (e.g. "generator worker" for an overlap worker)."""
        parallel = config.parallel
        self.name = name
        self.pp_size = pp = parallel.pp_size
        self.config = config
        # Stages go where the driver's copy of the models is (as a local executor's forward would).
        devices = stage_devices(models[0].loaded.model.output_weight.device, pp,
                                torch.cuda.device_count() if torch.cuda.is_available() else 0)
        transport = resolved_transport(parallel.transport, devices)
        self.devices, self.transport = devices, transport
        threads = parallel.threads_per_stage or max(1, (os.cpu_count() or 1) // pp)
        self.layers = {m.key: stage_layers(m.arch, pp, parallel.pp_layers if i == 0 else None,
                                           partial(measure_stage_costs, m.loaded, config,
                                                   m.samples_full_vocabulary, threads))
                       for i, m in enumerate(models)}
        slot_bytes = max(config.scheduler.max_num_batched_tokens * m.arch.hidden_size
                         * torch.empty((), dtype=m.dtype).element_size() for m in models)
        # Boundary b joins stage b to b + 1; one slot per microbatch in flight.
        shared = parallel.structure_aware and transport == "shm"
        slots = [[torch.zeros(slot_bytes, dtype=torch.uint8).share_memory_() for _ in range(pp)]
                 for _ in range(pp - 1)] if shared else [[] for _ in range(pp - 1)]
        self.startup_seconds = startup_seconds(sum(p.numel() * p.element_size() for m in models
                                                   for p in m.loaded.model.parameters()))
        self.socket_dir = Path(tempfile.mkdtemp(prefix="tts-pipeline-"))  # mode 0700
        self._bind_sockets()
        self.processes = self._spawn_stages(models, threads, slots)
        self._ids = itertools.count()
        self._pending: dict[int, Future[ModelOutput]] = {}
        self._lock = threading.Lock()
        self._traces: list[TraceDump] = []
        self._trace_ready = threading.Condition(self._lock)
        self._failure: PipelineFailure | None = None
        self._closed = False
        try:
            self._await_ready()
        except BaseException:
            self._stop_processes()
            self._close_sockets()
            raise
        self._receiver = threading.Thread(target=self._receive_loop, daemon=True, name="tts-pipeline-results")
        self._receiver.start()

    # -- start-up --------------------------------------------------------------------------
    def _address(self, name: str) -> str:
        return f"ipc://{self.socket_dir / name}"

    def _bind_sockets(self) -> None:
        """The driver's ends: one results socket all stages push to, one control socket per stage."""
        self.context = zmq.Context()
        self.results = self.context.socket(zmq.PULL)
        self.results.bind(self._address("results"))
        self.controls = []
        for stage in range(self.pp_size):
            control = self.context.socket(zmq.PUSH)
            control.bind(self._address(f"control-{stage}"))
            self.controls.append(control)

    def _spawn_stages(self, models: list[StageModel], threads: int,
                      slots: list[list[torch.Tensor]]) -> list[BaseProcess]:
        """One spawned process per stage, each told its layers, sockets, device and the
        shared-memory slots of the boundaries on either side (`slots[b]` joins stage b to b + 1)."""
        pp = self.pp_size
        distributed = f"tcp://127.0.0.1:{_free_port()}" if self.transport != "shm" else None
        spawn = mp.get_context("spawn")
        processes = []
        for stage in range(pp):
            setup = StageSetup(
                stage=stage, pp_size=pp, config=self.config, threads=threads, parent_pid=os.getpid(),
                models=[StageModelSetup(m.key, m.model, m.dtype, self.layers[m.key][stage], m.num_blocks)
                        for m in models],
                control_address=self._address(f"control-{stage}"), result_address=self._address("results"),
                receive_address=self._address(f"link-{stage - 1}") if stage > 0 else None,
                send_address=self._address(f"link-{stage}") if stage < pp - 1 else None,
                startup_seconds=self.startup_seconds,
                device=str(self.devices[stage]), transport=self.transport, distributed_address=distributed,
                receive_slots=slots[stage - 1] if stage > 0 else [],
                send_slots=slots[stage] if stage < pp - 1 else [])
            process = spawn.Process(target=stage_main, args=(setup,), daemon=True, name=f"tts-stage-{stage}")
            process.start()
            processes.append(process)
        return processes

    def _await_ready(self) -> None:
        ready: set[int] = set()
        deadline = time.monotonic() + self.startup_seconds
        while len(ready) < self.pp_size:
            if self.results.poll(_POLL_MS):
                message = self._decode()
                if isinstance(message, StageFailure):
                    raise PipelineFailure(self._failure_line(message))
                if isinstance(message, Ready):
                    ready.add(message.stage)
                continue
            dead = self._dead_stage()
            if dead is not None:
                raise PipelineFailure(dead)
            if time.monotonic() > deadline:
                raise PipelineFailure(f"pipeline stages {sorted(set(range(self.pp_size)) - ready)} did not start "
                                      f"within {self.startup_seconds:.0f} s")

    def _decode(self) -> object:
        try:
            return wire.decode([frame.buffer for frame in self.results.recv_multipart(copy=False)])
        except wire.WireError as error:
            raise PipelineFailure(f"{self.name} refused a message that is not in the pipeline's schema: "
                                  f"{error}") from None

    def _send_all(self, message: object) -> None:
        frames = wire.encode(message)  # once for every stage
        for control in self.controls:
            wire.send(control, frames, self._check_stages, _POLL_MS)

    def _check_stages(self) -> None:
        """Raise the group's failure, failing the group first if a stage has died (the
        receiving thread may not have looked yet)."""
        dead = self._dead_stage()
        if dead is not None:
            self._fail(PipelineFailure(dead))
        self.check()

    # -- launching -------------------------------------------------------------------------
    def can_launch(self) -> bool:
        with self._lock:
            return len(self._pending) < self.pp_size

    def check(self) -> None:
        """Raise the failure that stopped the group, if any: a caller that is not waiting on
        this group (an overlap worker's peer still computing) learns of it at once."""
        with self._lock:
            if self._failure is not None:
                raise self._failure

    def launch(self, model: str, batch: ModelInput, sample_plan: SamplePlan | None) -> Future[ModelOutput]:
        future: Future[ModelOutput] = Future()
        with self._lock:
            if self._failure is not None:
                raise self._failure
            microbatch = next(self._ids)
            self._pending[microbatch] = future
        self._send_all(Launch(microbatch, model, batch, sample_plan))
        return future

    def trace(self) -> list[TraceDump]:
        """Every stage's timeline so far: (what, microbatch, buffer version, start, end) with
        perf_counter times (one clock on one machine)."""
        with self._lock:
            self._traces = []
        self._send_all(TraceRequest())
        with self._trace_ready:
            self._trace_ready.wait_for(lambda: len(self._traces) == self.pp_size or self._failure is not None,
                                       timeout=30)
            if self._failure is not None:
                raise self._failure
            return sorted(self._traces, key=lambda dump: dump.stage)

    # -- results and failures -----------------------------------------------------------------
    def _receive_loop(self) -> None:
        while not self._closed:
            try:
                has_message = self.results.poll(_POLL_MS)
            except zmq.ZMQError:
                return
            if has_message:
                try:
                    self._handle(self._decode())
                except PipelineFailure as failure:
                    self._fail(failure)
                    return
                continue
            dead = self._dead_stage()
            if dead is not None:
                self._fail(PipelineFailure(dead))
                return

    def _handle(self, message) -> None:
        if isinstance(message, StageResult):
            with self._lock:
                future = self._pending.pop(message.microbatch, None)
            if future is not None:
                future.set_result(message.output)
        elif isinstance(message, TraceDump):
            with self._trace_ready:
                self._traces.append(message)
                self._trace_ready.notify_all()
        elif isinstance(message, StageFailure):
            self._fail(PipelineFailure(self._failure_line(message)))

    def _failure_line(self, failure: StageFailure) -> str:
        last = failure.traceback.strip().splitlines()[-1]
        return f"{self.name} stage {failure.stage} (pid {failure.pid}) raised {last}\n{failure.traceback}"

    def _dead_stage(self) -> str | None:
        if self._closed:
            return None
        for stage, process in enumerate(self.processes):
            if not process.is_alive():
                return f"{self.name} stage {stage} (pid {process.pid}) {_describe_exit(process.exitcode)}"
        return None

    def _fail(self, failure: PipelineFailure) -> None:
        with self._trace_ready:
            if self._failure is not None:  # the first failure is the one reported
                return
            self._failure = failure
            pending, self._pending = self._pending, {}
            self._trace_ready.notify_all()
        for future in pending.values():
            future.set_exception(failure)
        self._stop_processes()

    # -- shutdown --------------------------------------------------------------------------
    def shutdown(self) -> None:
        if self._closed:
            return
        if self._failure is None:
            try:
                self._send_all(Shutdown())
            except PipelineFailure:
                pass  # a stage died meanwhile: it is stopped below with the others
        for process in self.processes:
            process.join(timeout=5)
        self._closed = True
        self._stop_processes()
        self._receiver.join(timeout=2)
        self._close_sockets()

    def _stop_processes(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(timeout=2)

    def _close_sockets(self) -> None:
        for sock in [self.results, *self.controls]:
            sock.close(linger=0)
        self.context.term()
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def executor(self, key: str, owns_group: bool = False) -> PipelineExecutor:
        return PipelineExecutor(self, key, owns_group)


class PipelineExecutor:
    """One engine's handle on a pipeline group."""

    def __init__(self, group: PipelineGroup, key: str, owns_group: bool) -> None:
        self.group = group
        self.key = key
        self.owns_group = owns_group
        self.depth = group.pp_size
        self.samples = not group.config.parallel.sample_on_driver

    def can_launch(self) -> bool:
        return self.group.can_launch()

    def submit(self, batch: ModelInput, sample_plan: SamplePlan | None = None) -> Future[ModelOutput]:
        return self.group.launch(self.key, batch, sample_plan)

    def shutdown(self) -> None:
        if self.owns_group:
            self.group.shutdown()
