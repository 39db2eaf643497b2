"""Configuration dataclasses shared by the engine, the runtime and the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class ConfigError(ValueError):
    """A user-facing configuration mistake; the CLI prints it as one line."""


@dataclass(frozen=True)
class ModelSpec:
    """Which model to load: an alias (`tts models list`), an HF folder, a `.gguf` file,
    or `dummy:<builtin-config>` for random weights of a known shape."""

    model: str
    dtype: str = "auto"  # "auto", "float32", "bfloat16", "float16"


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    # Exactly one of these decides the pool size; num_blocks wins when both are set.
    num_blocks: int | None = None
    kv_cache_bytes: int | None = None
    enable_prefix_caching: bool = True


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = "sarathi"
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    # Largest prefill chunk for one sequence in one step (None: the token budget).
    max_prefill_chunk: int | None = None


@dataclass(frozen=True)
class EngineConfig:
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:1", ...
    attention_backend: str = "auto"  # "auto", "torch", "triton"
    seed: int = 0
    # Torch backend: run decodes in groups of similar context length rather than padding
    # the whole batch to its longest context.
    group_decodes_by_length: bool = True
    # GPU execution switches, honoured on CUDA only (the CPU path stays the eager reference):
    # replay decode steps from CUDA graphs captured at padded batch sizes (triton backend),
    # and run RMSNorm, rotary embedding and the gated activation as fused Triton kernels.
    cuda_graphs: bool = True
    compile: bool = True


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device '{device}' requested but CUDA is not available; use --device cpu")
    return dev


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is bf16 on GPU and fp32 on CPU (this CPU lacks AVX512-BF16: fp32 is faster)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ConfigError(f"unknown dtype '{dtype}'; choose one of auto, {', '.join(sorted(_DTYPES))}")
    return _DTYPES[dtype]
