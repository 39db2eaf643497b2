"""Device memory as a memory profile needs it: the device's totals, what torch's caching
allocator holds, and what else is in use (CUDA context, library workspaces, other
processes), which the KV budget must leave alone.

CUDA: NVML (`pynvml`, package nvidia-ml-py) for the device's total/used memory and this
process's usage; `cudaMemGetInfo` when NVML is missing or the device is a MIG slice (NVML
would report the whole GPU); torch's allocator statistics either way. CPU: totals from
/proc/meminfo; allocator and non-torch fields are None (CPU tensors come from the system
allocator, and a CPU "device" budget is whatever the user sets).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class AllocatorStats:
    """torch's CUDA caching allocator in this process, bytes."""

    allocated: int  # held by live tensors
    reserved: int  # allocated + cached for reuse (what the device sees torch holding)
    peak_allocated: int  # since the start or the last torch.cuda.reset_peak_memory_stats
    peak_reserved: int


@dataclass(frozen=True)
class DeviceMemoryInfo:
    device: str
    source: str  # "nvml", "cuda" (cudaMemGetInfo), "meminfo" (/proc/meminfo) or "none"
    total: int | None
    free: int | None
    used: int | None  # by every process on the device
    process_used: int | None  # by this process, as NVML reports it (None: NVML cannot see it)
    allocator: AllocatorStats | None
    # Device memory in use that torch's allocator does not hold: this process's usage minus
    # torch's reservation when NVML reports it, else the device's used minus the
    # reservation (which then also counts other processes: unavailable to us all the same).
    non_torch: int | None


def device_memory_info(device: torch.device | str) -> DeviceMemoryInfo:
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_info(device)
    return _meminfo(device)


def _meminfo(device: torch.device) -> DeviceMemoryInfo:
    fields: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, value = line.split(":", 1)
            fields[name] = int(value.split()[0]) * 1024  # reported in kB
    except (OSError, ValueError):
        return DeviceMemoryInfo(str(device), "none", None, None, None, None, None, None)
    total, available = fields.get("MemTotal"), fields.get("MemAvailable")
    used = total - available if total is not None and available is not None else None
    return DeviceMemoryInfo(str(device), "meminfo", total, available, used, None, None, None)


def _allocator_stats(device: torch.device) -> AllocatorStats:
    stats = torch.cuda.memory_stats(device)
    return AllocatorStats(
        allocated=stats.get("allocated_bytes.all.current", 0),
        reserved=stats.get("reserved_bytes.all.current", 0),
        peak_allocated=stats.get("allocated_bytes.all.peak", 0),
        peak_reserved=stats.get("reserved_bytes.all.peak", 0),
    )


def _cuda_info(device: torch.device) -> DeviceMemoryInfo:
    index = device.index if device.index is not None else torch.cuda.current_device()
    device = torch.device("cuda", index)
    allocator = _allocator_stats(device)
    with _nvml() as nvml:
        handle = _nvml_handle(nvml, device) if nvml is not None else None
        if handle is not None:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            process_used = _process_used(nvml, handle)
            base = process_used if process_used is not None else memory.used
            return DeviceMemoryInfo(str(device), "nvml", memory.total, memory.free, memory.used, process_used,
                                    allocator, max(0, base - allocator.reserved))
    free, total = torch.cuda.mem_get_info(device)
    return DeviceMemoryInfo(str(device), "cuda", total, free, total - free, None, allocator,
                            max(0, total - free - allocator.reserved))


@contextmanager
def _nvml() -> Iterator[object | None]:
    """The pynvml module, initialised for the block (None without NVML)."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver library, no permission
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def _nvml_handle(nvml, device: torch.device):
    """NVML's handle of a torch device, by UUID (NVML numbers devices ignoring
    CUDA_VISIBLE_DEVICES); None for MIG slices and devices NVML does not know."""
    uuid = str(torch.cuda.get_device_properties(device).uuid)
    try:
        handle = nvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    except nvml.NVMLError:
        return None
    try:
        if nvml.nvmlDeviceGetMigMode(handle)[0] == nvml.NVML_DEVICE_MIG_ENABLE:
            return None
    except nvml.NVMLError:  # MIG is not supported on this GPU
        pass
    return handle


def _process_used(nvml, handle) -> int | None:
    """This process's device memory; None when NVML lists other PID namespaces' ids
    (containers) or withholds per-process usage."""
    try:
        processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except nvml.NVMLError:
        return None
    pid = os.getpid()
    used = [p.usedGpuMemory for p in processes if p.pid == pid and p.usedGpuMemory is not None]
    return sum(used) if used else None


def gpu_facts(device: torch.device | str) -> dict:
    """What a benchmark report records about a GPU: name, memory, driver and CUDA versions."""
    device = torch.device(device)
    props = torch.cuda.get_device_properties(device)
    facts = {"gpu": props.name, "gpu_memory_bytes": props.total_memory,
             "compute_capability": f"{props.major}.{props.minor}", "sm_count": props.multi_processor_count,
             "cuda_runtime": torch.version.cuda}
    with _nvml() as nvml:
        if nvml is not None:
            version = nvml.nvmlSystemGetCudaDriverVersion()
            facts["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
            facts["cuda_driver"] = f"{version // 1000}.{version % 1000 // 10}"
            facts["nvml"] = _text(nvml.nvmlSystemGetNVMLVersion())
            handle = _nvml_handle(nvml, device)
            if handle is not None:
                facts.update(_device_facts(nvml, handle))
    return facts


def _device_facts(nvml, handle) -> dict:
    queries = {
        "power_limit_w": lambda: nvml.nvmlDeviceGetPowerManagementLimit(handle) / 1000,
        "max_sm_clock_mhz": lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM),
        "max_mem_clock_mhz": lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM),
    }
    facts = {}
    for name, query in queries.items():
        try:
            facts[name] = query()
        except nvml.NVMLError:  # not supported on this GPU, or not permitted in this container
            pass
    return facts


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, or None (another C library, another OS)."""
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)
    except OSError:
        return None


def return_freed_host_memory() -> None:
    """Hand the host memory that freed CPU tensors left in the C heap back to the OS.

    CPU tensors come from the system allocator. Once glibc frees a large mapped block it
    raises its mmap threshold (up to 32 MiB), so later KV and activation buffers of that
    size come from the heap, which only shrinks from its top: a process that builds runtime
    after runtime (a sweep, a benchmark) keeps every earlier one's freed memory resident
    and grows with each (docs/benchmarks/cohost.md measured 7.5 GB for a 3 GiB budget
    after four runtimes). Call it when the earlier runtimes are garbage."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
