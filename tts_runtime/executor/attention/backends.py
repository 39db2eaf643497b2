"""Which paged-attention backend runs: `select_backend` (torch, the C++ CPU kernel, triton).

The CPU kernel's module imports the interface from attention.py; this module imports both,
so no module imports back into the one that imports it."""

from __future__ import annotations

import functools
import logging

import torch

from tts_runtime.config import ConfigError, EngineConfig
from tts_runtime.executor.attention.attention import AttentionBackend, TorchAttention
from tts_runtime.executor.cpu.cpu_attention import CpuPagedAttention, load_kernel
from tts_runtime.executor.cpu.cpu_extensions import KernelUnavailable

log = logging.getLogger(__name__)


def select_backend(name: str, device: torch.device, group_decodes_by_length: bool = True,
                   cascade: bool | None = None, bf16_dot: bool = True,
                   few_lanes: bool = True) -> AttentionBackend:
    """`auto`: triton on CUDA; on CPU the in-place C++ kernel (cpu_attention.py), or the torch
    backend with a one-time warning when the kernel cannot be built here. `cascade`:
    shared-prefix attention in the cpu and triton backends (None: on in cpu, off in triton);
    `bf16_dot`: the cpu kernel's AVX512-BF16 dot products on a bf16 cache; `few_lanes`:
    its score and value loops for lane groups of at most 4 query vectors."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "cpu"
        if name == "cpu" and kernel_unavailable() is not None:
            name = "torch"
    if name == "torch":
        return TorchAttention(group_decodes_by_length)
    if name == "cpu":
        if device.type != "cpu":
            raise ConfigError(f"attention backend 'cpu' runs on the CPU, not on {device}")
        reason = kernel_unavailable()
        if reason is not None:
            raise ConfigError(f"attention backend 'cpu': the C++ kernel is unavailable ({reason}); "
                              "use --attention-backend torch")
        return CpuPagedAttention(load_kernel(), cascade is not False, fallback=TorchAttention(group_decodes_by_length),
                                 bf16_dot=bf16_dot, few_lanes=few_lanes)
    if name == "triton":
        from tts_runtime.executor.attention.triton_attention import TritonAttention

        return TritonAttention(cascade=bool(cascade))
    raise ConfigError(f"unknown attention backend '{name}'; choose auto, cpu, torch or triton")


@functools.cache
def kernel_unavailable() -> str | None:
    """Why the CPU kernel cannot be used here (None: it can); warns once."""
    try:
        load_kernel()
    except KernelUnavailable as exc:
        log.warning("CPU paged-attention kernel unavailable, using the torch backend: %s", exc)
        return str(exc)
    return None


def backend_for(config: EngineConfig, device: torch.device) -> AttentionBackend:
    """select_backend with an engine configuration's attention options."""
    return select_backend(config.attention_backend, device, config.group_decodes_by_length,
                          config.cascade_attention, config.attention_bf16_dot, config.attention_few_lanes)
