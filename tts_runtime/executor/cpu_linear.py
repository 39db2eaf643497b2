"""bf16 projections on the CPU through tts's own kernel (csrc/linear_cpu.cpp), on weights
packed once into one sequential stream.

A decode step's projections at beam search's few rows are bound by streaming the weights
from memory; on oneDNN's blocked layout that stream is not hidden behind the arithmetic
(580 us a layer with the weights in cache, 800 us streaming them). Read front to back, the stream keeps the
prefetcher ahead: measured alone on SmolLM2's four projections at 16 rows (30 layers, the
weights out of cache), 606 us a layer against oneDNN prepacked's 819 at one thread, 332
against 524 at two; at 256 and 1024 rows it is still 1.06x and 1.03x, so it serves every
row count. Weights it cannot take (other dtypes, outputs not a multiple of 16, odd inputs,
tensors made per call such as a PRM's candidate columns) go to oneDNN.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from types import ModuleType

import torch
from torch import nn

from tts_runtime.executor.cpu_extensions import KernelUnavailable, load_extension


@functools.cache
def load_linear_kernel() -> ModuleType:
    """Builds or loads the extension; raises KernelUnavailable when it cannot be built or the
    CPU lacks AVX512-BF16."""
    kernel = load_extension("tts_linear_cpu", "linear_cpu.cpp")
    if not kernel.available():
        raise KernelUnavailable("this CPU has no AVX512-BF16")
    return kernel


def streamable(weight: torch.Tensor) -> bool:
    """Whether the kernel takes this weight: 2-d bf16, outputs a multiple of 16, inputs even."""
    return (weight.dim() == 2 and weight.dtype == torch.bfloat16 and weight.shape[0] % 16 == 0
            and weight.shape[1] % 2 == 0)


class StreamedLinear:
    """The projections of `models` on the kernel, each weight packed on its first use (a copy
    beside the module's, counted by the memory profile like oneDNN's prepacked one); every
    other call on `fallback`."""

    def __init__(self, kernel: ModuleType, models: Sequence[nn.Module],
                 fallback: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]) -> None:
        self._kernel = kernel
        self._fallback = fallback
        self._weights = {id(p): p for model in models for p in model.parameters() if streamable(p)}
        self._packed: dict[int, torch.Tensor] = {}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        key = id(weight)
        if self._weights.get(key) is not weight or x.dtype != torch.bfloat16:
            return self._fallback(x, weight, bias)
        packed = self._packed.get(key)
        if packed is None:
            packed = self._packed[key] = self._kernel.pack_weight(weight.detach())
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = self._kernel.linear(rows, packed, weight.shape[0]).view(*x.shape[:-1], weight.shape[0])
        return out if bias is None else out + bias
