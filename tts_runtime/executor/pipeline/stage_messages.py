"""Messages between the pipeline's driver and its stage processes (wire.py puts them on
ZeroMQ as schema'd msgpack; `StageSetup` travels once, as the spawned process's argument).

Control (driver -> every stage, at launch, before any stage computes): `Launch`,
`TraceRequest`, `Shutdown`. Results and status (stages -> driver): `Ready`,
`StageResult` (last stage), `TraceDump`, `StageFailure`. Between stages: `Activation`,
only when the transport is not structure-aware (see activation_link.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tts_runtime.config import EngineConfig
from tts_runtime.executor.batch import ModelInput, ModelOutput, SamplePlan

# A stage's start-up: importing torch and setting up (the base), then reading its slice of
# every model; both allow a busy shared machine (two demo stages have taken over 100 s
# where they take 15 s alone) and a slow disk (about 17 MB/s).
STARTUP_BASE_SECONDS = 120.0
STARTUP_SECONDS_PER_GIB = 60.0


def startup_seconds(weight_bytes: int) -> float:
    """How long the driver waits for its stages to load `weight_bytes` of models."""
    return STARTUP_BASE_SECONDS + STARTUP_SECONDS_PER_GIB * weight_bytes / (1 << 30)


@dataclass(frozen=True)
class StageModelSetup:
    """One model's slice on one stage."""

    key: str
    model: str  # what load_model resolves (alias, folder, .gguf, dummy:...)
    dtype: torch.dtype
    layers: range
    num_blocks: int


@dataclass
class StageSetup:
    stage: int
    pp_size: int
    models: list[StageModelSetup]
    config: EngineConfig
    threads: int
    parent_pid: int
    control_address: str  # this stage's control stream (it connects)
    result_address: str  # to the driver (it connects)
    receive_address: str | None  # activations from the previous stage (it binds)
    send_address: str | None  # activations to the next stage (it connects)
    startup_seconds: float  # the driver's wait for every stage to be ready
    device: str = "cpu"  # where this stage's layers, KV and activations live
    transport: str = "shm"  # resolved: shm, gloo or nccl (stage_placement.py)
    distributed_address: str | None = None  # the stages' process group (gloo, nccl)
    # Shared-memory activation slots (uint8), slot = microbatch mod pp.
    receive_slots: list[torch.Tensor] = field(default_factory=list)
    send_slots: list[torch.Tensor] = field(default_factory=list)

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.pp_size - 1


@dataclass
class Launch:
    microbatch: int
    model: str
    batch: ModelInput
    sample_plan: SamplePlan | None  # set when the last stage samples (SiPipe's driver sampling off)


@dataclass
class TraceRequest:
    pass


@dataclass
class Shutdown:
    pass


@dataclass
class Ready:
    stage: int
    pid: int


@dataclass
class StageResult:
    microbatch: int
    output: ModelOutput


@dataclass
class TraceDump:
    stage: int
    events: list[tuple[str, int, int, float, float]]  # (what, microbatch, buffer version, start, end)


@dataclass
class StageFailure:
    stage: int
    pid: int
    traceback: str


@dataclass
class Activation:
    microbatch: int
    hidden: torch.Tensor
