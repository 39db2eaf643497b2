"""How a stage's output activations reach the next stage (the resolved transport, see
stage_placement.py).

* shm: shared-memory slots, one per microbatch in flight (slot = microbatch mod pp);
  ZeroMQ carries only a ready signal holding the microbatch id. The slot of microbatch m
  is rewritten only by m + pp, which cannot launch before m has left the last stage, so
  the receiver reads it in place (a GPU stage copies it to its device).
* gloo / nccl: torch.distributed point-to-point between the stage processes (a process
  group of the pp stages; the driver is not a member). The tensor itself travels over
  gloo's TCP pairs (from host memory) or NCCL (GPU to GPU), after a one-element header
  holding the microbatch id.

Structure-aware transmission (SiPipe): the receiver sizes the activation from the
schedule it already holds, so only the microbatch id travels beside the data. Off, every
transfer also carries the activation's shape (shm: the activation goes as a wire.py
`Activation` message; gloo / nccl: a three-element header).

A receive returns the activation on the stage's device.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Callable, Protocol

import torch
import torch.distributed as dist
import zmq

from tts_runtime.executor.pipeline import wire
from tts_runtime.executor.pipeline.stage_messages import Activation, StageSetup


class ActivationLink(Protocol):
    def send(self, microbatch: int, hidden: torch.Tensor) -> None: ...

    def receive(self, microbatch: int, tokens: int, hidden_size: int, dtype: torch.dtype) -> torch.Tensor: ...


def _check_order(stage: int, expected: int, got: int) -> None:
    if got != expected:
        raise RuntimeError(f"stage {stage} expected microbatch {expected}, got {got}: "
                           "stages must run microbatches in launch order")


class SharedMemoryLink:
    def __init__(self, setup: StageSetup, context: zmq.Context, check: Callable[[], None], poll_ms: int) -> None:
        """`check` runs every `poll_ms` while a send or receive waits (it exits when the
        driver is gone)."""
        self.setup = setup
        self.device = torch.device(setup.device)
        self.structure_aware = setup.config.parallel.structure_aware
        self._check, self._poll_ms = check, poll_ms
        self.upstream = self.downstream = None
        if setup.receive_address is not None:
            self.upstream = context.socket(zmq.PULL)
            self.upstream.bind(setup.receive_address)
        if setup.send_address is not None:
            self.downstream = context.socket(zmq.PUSH)
            self.downstream.connect(setup.send_address)

    def _slot(self, slots: list[torch.Tensor], microbatch: int, tokens: int, hidden_size: int,
              dtype: torch.dtype) -> torch.Tensor:
        size = torch.empty((), dtype=dtype).element_size()
        raw = slots[microbatch % self.setup.pp_size][: tokens * hidden_size * size]
        return raw.view(dtype).view(tokens, hidden_size)

    def send(self, microbatch: int, hidden: torch.Tensor) -> None:
        if self.structure_aware:
            tokens, hidden_size = hidden.shape
            self._slot(self.setup.send_slots, microbatch, tokens, hidden_size, hidden.dtype).copy_(hidden)
            frames = [microbatch.to_bytes(8, "little")]
        else:
            frames = wire.encode(Activation(microbatch, hidden))
        wire.send(self.downstream, frames, self._check, self._poll_ms)

    def receive(self, microbatch: int, tokens: int, hidden_size: int, dtype: torch.dtype) -> torch.Tensor:
        if self.structure_aware:
            while not self.upstream.poll(self._poll_ms):
                self._check()
            signal = self.upstream.recv()
            if len(signal) != 8:
                raise wire.WireError(f"stage {self.setup.stage}: a ready signal of {len(signal)} bytes, not 8")
            _check_order(self.setup.stage, microbatch, int.from_bytes(signal, "little"))
            return self._slot(self.setup.receive_slots, microbatch, tokens, hidden_size, dtype).to(self.device)
        message = wire.receive(self.upstream, self._check, self._poll_ms)
        if not isinstance(message, Activation):
            raise wire.WireError(f"stage {self.setup.stage}: a {type(message).__name__} where an activation belongs")
        _check_order(self.setup.stage, microbatch, message.microbatch)
        return message.hidden.to(self.device)

    def close(self) -> None:
        for socket in (self.upstream, self.downstream):
            if socket is not None:
                socket.close(linger=0)


class DistributedLink:
    """Sends are asynchronous (the stage goes on computing); a send's buffers are kept until
    the next send to the same stage has been issued and the earlier one has completed."""

    def __init__(self, setup: StageSetup, startup_seconds: float) -> None:
        self.setup = setup
        self.structure_aware = setup.config.parallel.structure_aware
        self.device = torch.device(setup.device)
        # gloo sends from host memory; NCCL from the stage's GPU.
        self.wire = self.device if setup.transport == "nccl" else torch.device("cpu")
        dist.init_process_group(setup.transport, init_method=setup.distributed_address, rank=setup.stage,
                                world_size=setup.pp_size, timeout=timedelta(seconds=startup_seconds),
                                device_id=self.device if setup.transport == "nccl" else None)
        self._in_flight: list[dist.Work] = []
        self._kept: tuple[torch.Tensor, ...] = ()

    def send(self, microbatch: int, hidden: torch.Tensor) -> None:
        for work in self._in_flight:
            work.wait()
        tokens, hidden_size = hidden.shape
        header = [microbatch] if self.structure_aware else [microbatch, tokens, hidden_size]
        self._kept = (torch.tensor(header, dtype=torch.int64, device=self.wire), hidden.to(self.wire).contiguous())
        self._in_flight = [dist.isend(tensor, dst=self.setup.stage + 1) for tensor in self._kept]

    def receive(self, microbatch: int, tokens: int, hidden_size: int, dtype: torch.dtype) -> torch.Tensor:
        source = self.setup.stage - 1
        header = torch.empty(1 if self.structure_aware else 3, dtype=torch.int64, device=self.wire)
        dist.recv(header, src=source)
        _check_order(self.setup.stage, microbatch, int(header[0]))
        if not self.structure_aware:
            tokens, hidden_size = int(header[1]), int(header[2])
        hidden = torch.empty(tokens, hidden_size, dtype=dtype, device=self.wire)
        dist.recv(hidden, src=source)
        return hidden.to(self.device)

    def close(self) -> None:
        # Every send was received: the driver shuts stages down after their last results.
        dist.destroy_process_group()
