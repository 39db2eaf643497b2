"""fp32 projections on CPUs with AVX2 and FMA through tts's own kernel
(csrc/linear_fp32_cpu.cpp), on weights packed once into one sequential stream, stored as
fp32 or as bf16 (half the bytes to stream, widened to fp32 in registers; the weights then
carry bf16's 8-bit mantissa, the activations and sums stay fp32).

The AVX512-BF16 kernel (cpu_linear.py) serves bf16 models on CPUs that have it; this one
serves fp32 models, which is what `--dtype auto` runs on CPUs without AVX512-BF16.
Measurements against oneDNN: docs/benchmarks/linear_avx2.md.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from types import ModuleType

import torch
from torch import nn

import tts_runtime.cpu_features as cpu_features
from tts_runtime.executor.cpu.cpu_extensions import KernelUnavailable, load_extension
from tts_runtime.executor.cpu.streamed_linear import StreamedLinear
from tts_runtime.models.layers import LinearFn

# What the kernel needs; without it `load_fp32_linear_kernel` does not even build it.
REQUIRES = ("avx2", "fma")


def applies() -> bool:
    """Whether this CPU (as cpu_features sees it) has what the kernel needs."""
    return all(cpu_features.has(f) for f in REQUIRES)


@functools.cache
def load_fp32_linear_kernel(march: str | None = None) -> ModuleType:
    """Builds or loads the extension (for `march`, default cpu_features.march()); raises
    KernelUnavailable, without building, where the CPU (as cpu_features sees it) lacks AVX2
    or FMA, and when the build has no AVX2 kernel or cannot be built."""
    if march is None and not applies():
        raise KernelUnavailable("needs AVX2 and FMA, which this CPU has not")
    kernel = load_extension("tts_linear_fp32_cpu", "linear_fp32_cpu.cpp", march=march)
    if not kernel.available():
        raise KernelUnavailable(f"built for -march={march or cpu_features.march()}, which has no AVX2 and FMA")
    return kernel


def streamable(weight: torch.Tensor) -> bool:
    """Whether the kernel takes this weight: 2-d fp32, outputs a multiple of 8."""
    return weight.dim() == 2 and weight.dtype == torch.float32 and weight.shape[0] % 8 == 0


class StreamedFp32Linear(StreamedLinear):
    """The fp32 projections of `models` on the kernel, stored as bf16 where `bf16_weights`,
    at any number of rows: under AVX2 the kernel measured 1.8-2.5x oneDNN prepacked at 1-4
    rows, 1.4-1.9x at 8-16, 1.1-1.2x at 64 and 1.06-1.18x at 256-1024
    (docs/benchmarks/linear_avx2.md)."""

    def __init__(self, kernel: ModuleType, models: Sequence[nn.Module], fallback: LinearFn,
                 bf16_weights: bool = False) -> None:
        super().__init__(kernel, models, fallback, takes=streamable,
                         pack=lambda weight: kernel.pack_weight(weight, bf16_weights))
