"""Where each pipeline stage runs, and how its activations travel to the next one.

On CUDA, stage s takes GPU (first + s) mod the GPU count: a GPU of its own when there are
enough, else stages share GPUs (each stage is its own process with its own CUDA context).
Transport "auto" is NCCL when every stage has a GPU of its own (NCCL cannot pair two ranks
on one device), else shared memory, which for GPU stages goes through host memory (a
device-to-host copy into the slot, host-to-device out of it).
"""

from __future__ import annotations

import torch

from tts_runtime.config import ConfigError


def stage_devices(device: torch.device, pp_size: int, gpu_count: int) -> list[torch.device]:
    if device.type != "cuda":
        return [torch.device("cpu")] * pp_size
    first = device.index or 0
    return [torch.device("cuda", (first + stage) % gpu_count) for stage in range(pp_size)]


def resolved_transport(requested: str, devices: list[torch.device]) -> str:
    """What `ParallelConfig.transport` means for stages on `devices`."""
    own_gpus = all(d.type == "cuda" for d in devices) and len(set(devices)) == len(devices)
    if requested == "auto":
        return "nccl" if own_gpus else "shm"
    if requested == "nccl" and not own_gpus:
        raise ConfigError(f"--pp-transport nccl needs every stage on a GPU of its own (the stages are on "
                          f"{', '.join(map(str, devices))}); use --pp-transport shm or gloo")
    return requested
