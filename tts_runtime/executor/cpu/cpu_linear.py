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

Those measurements were on an AMD EPYC, which has AVX512-BF16 but no AMX. On a CPU with
AMX tiles (Intel Sapphire Rapids and later) oneDNN's bf16 matmul runs on the tiles and
overtakes the kernel early: SmolLM2's 1536x576 projection, 30 distinct weights, on an
Intel Xeon with AMX, two threads: kernel 37 us at 1 row and 41 at 2 against prepacked
oneDNN's 56 and 54, but 49 against 58 at 4 rows, 76 against 56 at 8 and 150 against 59 at
16 (one thread: 73 against 95 at 1 row, 163 against 97 at 4). There the kernel serves calls
of at most `AMX_MAX_ROWS` rows and the rest go to oneDNN.
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


# On AMX CPUs the largest call the kernel still wins (see above).
AMX_MAX_ROWS = 2


# What the kernel needs; without it `load_linear_kernel` does not even build it.
REQUIRES = "avx512_bf16"


def row_limit() -> int | None:
    """Rows above which oneDNN is faster than the kernel on this CPU: None (every row count)
    without AMX, `AMX_MAX_ROWS` with it."""
    return AMX_MAX_ROWS if cpu_features.has("amx_tile") else None


@functools.cache
def load_linear_kernel(march: str | None = None) -> ModuleType:
    """Builds or loads the extension (for `march`, default cpu_features.march()); raises
    KernelUnavailable, without building, where the CPU (as cpu_features sees it) lacks
    AVX512-BF16, and when the build has no AVX512-BF16 kernel or cannot be built."""
    if march is None and not cpu_features.has(REQUIRES):
        raise KernelUnavailable("needs AVX512-BF16, which this CPU has not"
                                + ("" if cpu_features.level() == "native" else f" ({cpu_features.ENV}={cpu_features.level()})"))
    kernel = load_extension("tts_linear_cpu", "linear_cpu.cpp", march=march)
    if not kernel.available():
        raise KernelUnavailable(f"built for -march={march or cpu_features.march()}, which has no AVX512-BF16")
    return kernel


def streamable(weight: torch.Tensor) -> bool:
    """Whether the kernel takes this weight: 2-d bf16, outputs a multiple of 16, inputs even."""
    return (weight.dim() == 2 and weight.dtype == torch.bfloat16 and weight.shape[0] % 16 == 0
            and weight.shape[1] % 2 == 0)


class StreamedBf16Linear(StreamedLinear):
    """The bf16 projections of `models` on the kernel; calls of more than `max_rows` rows
    (`row_limit()`) on `fallback`."""

    def __init__(self, kernel: ModuleType, models: Sequence[nn.Module], fallback: LinearFn,
                 max_rows: int | None = None) -> None:
        super().__init__(kernel, models, fallback, takes=streamable, pack=kernel.pack_weight, max_rows=max_rows)
