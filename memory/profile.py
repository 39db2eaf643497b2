"""Memory profile of one model: the thesis's decomposition of what a co-hosted model needs.

    KV = budget x utilisation - (weights + peak activations + non-torch)

Weights are counted from the parameter tensors. Peak activations are measured by running
the engine's profiling forward (the largest step it can be asked for, see
tts_runtime/executor/profiling_forward.py) and reading the allocator's peak:

* GPU: torch.cuda.max_memory_allocated over the forward; non-torch memory (CUDA context,
  library workspaces) is read by the caller from NVML (tts_runtime/engine/device_memory.py)
  as this process's device usage minus what torch reserved.
* CPU: the torch profiler's record of CPU allocations ("Total Allocated" of every
  allocation event during the forward); a CPU budget is a user-set stand-in for a
  device, so non-torch memory (the Python process itself) is outside it and counts 0.

This module measures around a forward it is handed; it builds no model itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

GiB = 1 << 30
MiB = 1 << 20
# Bump when what a profile measures changes, so cached profiles are not reused.
PROFILE_VERSION = 4


@dataclass(frozen=True)
class MemoryProfile:
    model: str
    weights_bytes: int
    activation_bytes: int  # peak of the profiling forward
    non_torch_bytes: int
    kv_bytes_per_token: int  # K and V of every layer
    num_layers: int
    block_size: int
    profiled_tokens: int  # tokens in the profiling forward (max batched tokens)
    method: str  # how activations and non-torch memory were measured
    # 2 x parameters outside the embedding and output tables: the cost of recomputing one
    # prompt token (a recomputed prefix never reaches the output layer).
    flops_per_token: int

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return self.kv_bytes_per_token // self.num_layers

    @property
    def block_bytes(self) -> int:
        """One KV block: block_size tokens x bytes per token per layer x layers."""
        return self.block_size * self.kv_bytes_per_token_per_layer * self.num_layers

    def to_dict(self) -> dict:
        return {**asdict(self), "block_bytes": self.block_bytes,
                "kv_bytes_per_token_per_layer": self.kv_bytes_per_token_per_layer}

    @classmethod
    def from_dict(cls, row: dict) -> MemoryProfile:
        return cls(**{k: row[k] for k in cls.__dataclass_fields__})


def weight_bytes(model: torch.nn.Module) -> int:
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


def measure_forward(forward: Callable[[], None], device: torch.device) -> tuple[int, str]:
    """(peak bytes allocated by one run of `forward`, how it was measured)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        forward()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - base,
                "cuda: torch.cuda.max_memory_allocated over the profiling forward")
    return _measure_cpu(forward), "cpu: peak of torch CPU allocations during the profiling forward (torch profiler)"


def _measure_cpu(forward: Callable[[], None]) -> int:
    # The profiler's CPU allocator reporter counts only allocations made while it runs, so
    # its running total is exactly the memory the forward added on top of what existed.
    activities = [torch.profiler.ProfilerActivity.CPU]
    with _without_profiler_chatter(), torch.profiler.profile(activities=activities, profile_memory=True) as prof:
        forward()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events
              if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
    return max(totals, default=0)


# Kineto's start and stop lines ("USDT:... SyncActivityProfilerHandler.cpp:52] profiler_start"),
# which it writes to stderr from C++ whatever KINETO_LOG_LEVEL says.
_PROFILER_CHATTER = re.compile(r"^(USDT|STAGE):\S+ \S+ \d+:\d+ \w+\.cpp:\d+\] ")


@contextlib.contextmanager
def _without_profiler_chatter():
    """Runs the block with file descriptor 2 in a temporary file, then writes what it caught
    back to stderr less the profiler's own start/stop lines: errors and warnings still show."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            kept = [line for line in caught.read().decode(errors="replace").splitlines(keepends=True)
                    if not _PROFILER_CHATTER.match(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def profile_model(model: str, module: torch.nn.Module, kv_bytes_per_token: int, num_layers: int,
                  block_size: int, profiled_tokens: int, forward: Callable[[], None],
                  device: torch.device, non_torch: Callable[[], int | None], flops_per_token: int,
                  packed_weights_bytes: int) -> MemoryProfile:
    """Profile one loaded model. `forward` is its profiling forward (set up by the caller);
    `non_torch()` reads the device memory torch does not hold, after the forward (None on
    a CPU, whose budget is a stand-in that the process itself is outside of);
    `packed_weights_bytes` is what the executor's layout copies of the weights add."""
    forward()  # warm-up: lazy kernel/library initialisation is not activation memory
    activations, method = measure_forward(forward, device)
    outside = non_torch()
    method += ("; non-torch = device memory in use minus torch's reservation" if outside is not None
               else "; non-torch memory is outside a CPU budget (0)")
    return MemoryProfile(model=model, weights_bytes=weight_bytes(module) + packed_weights_bytes,
                         activation_bytes=activations,
                         non_torch_bytes=outside or 0, kv_bytes_per_token=kv_bytes_per_token,
                         num_layers=num_layers, block_size=block_size, profiled_tokens=profiled_tokens,
                         method=method, flops_per_token=flops_per_token)


@dataclass(frozen=True)
class ProfileCache:
    """Profiles on disk, keyed by everything that changes them: a profiling forward at the
    full token budget takes seconds to minutes on a CPU, and its result is deterministic."""

    directory: Path

    def _path(self, key: dict) -> Path:
        text = json.dumps({**key, "version": PROFILE_VERSION, "torch": torch.__version__}, sort_keys=True)
        return self.directory / f"{hashlib.sha256(text.encode()).hexdigest()[:24]}.json"

    def get(self, key: dict) -> MemoryProfile | None:
        path = self._path(key)
        if not path.is_file():
            return None
        return MemoryProfile.from_dict(json.loads(path.read_text()))

    def put(self, key: dict, profile: MemoryProfile) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".partial")
        tmp.write_text(json.dumps(profile.to_dict(), indent=2))
        tmp.rename(path)


def format_bytes(n: int) -> str:
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    if abs(n) >= MiB:
        return f"{n / MiB:.1f} MiB"
    # Small sizes too ("--device-memory 1KiB" is not "0.0 MiB").
    return f"{n / 1024:.1f} KiB" if abs(n) >= 1024 else f"{n} bytes"


def size_option(n: int) -> str:
    """`n` bytes as --device-memory reads it, rounded down (to 0.1 GiB, or to MiB below 1 GiB)."""
    return f"{math.floor(n / GiB * 10) / 10}GiB" if n >= GiB else f"{n // MiB}MiB"
