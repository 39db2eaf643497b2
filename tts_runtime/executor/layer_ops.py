"""Which layer ops an executor runs its model with."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
from torch import nn

import tts_runtime.cpu_features as cpu_features
from tts_runtime.config import ConfigError, EngineConfig
from tts_runtime.executor.cpu.cpu_extensions import KernelUnavailable
from tts_runtime.models.layers import EAGER_OPS, LayerOps, LinearFn

# The row count oneDNN picks its blocked weight layout for; measured at 1, 16 and 512 rows
# on SmolLM2's 3072x576 projection, a layout chosen for 128 rows was as fast as the best
# at each.
_PACKING_ROWS_HINT = 128

log = logging.getLogger(__name__)


@functools.cache
def onednn_takes_bf16() -> bool:
    """Whether oneDNN's matmul runs bf16 here: it needs AVX-512 (avx512_core), AVX-NE-CONVERT
    or AMX; on an AVX2 CPU it cannot create the primitive, and bf16 calls go to F.linear."""
    return (torch.ops.mkldnn._is_mkldnn_bf16_supported()
            and any(cpu_features.has(f) for f in ("avx512bw", "avx_ne_convert", "amx_bf16")))


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear through oneDNN's matmul. For fp32, torch's F.linear calls MKL's sgemm,
    which on AMD CPUs runs a generic path several times slower at the row counts beam
    search decodes with; oneDNN's JIT kernels use the AVX-512 the CPU has. bf16 where
    oneDNN cannot (`onednn_takes_bf16`) runs F.linear."""
    if x.dtype == torch.bfloat16 and not onednn_takes_bf16():
        return torch.nn.functional.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class PrepackedLinear:
    """oneDNN's matmul on weights reordered once into oneDNN's blocked layout. Given a plain
    weight, oneDNN reorders it on every call; vLLM's CPU path prepacks for the same reason.

    The packed copy of a weight is made on its first use, so a model's output layer is
    packed only by an engine that samples from it (a PRM computes a few columns of it, a
    new tensor each time, which stays plain). Packed copies are memory on top of the
    module's weights, and `packed_weight_bytes` tells the memory profile how much."""

    def __init__(self, models: Sequence[nn.Module]) -> None:
        self._weights = {id(p): p for model in models for p in model.parameters()}
        self._packed: dict[int, torch.Tensor] = {}

    @property
    def packed_weight_ids(self) -> tuple[int, ...]:
        """`id()`s of the weights packed into oneDNN's layout so far, in the order first used."""
        return tuple(self._packed)

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        key = id(weight)
        packed = self._packed.get(key)
        if packed is None:
            if self._weights.get(key) is not weight or (x.dtype == torch.bfloat16 and not onednn_takes_bf16()):
                return onednn_linear(x, weight, bias)
            packed = self._packed[key] = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACKING_ROWS_HINT)
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def resolved_linear_backend(device: torch.device, config: EngineConfig, dtype: torch.dtype | None = None) -> str:
    """What `linear_backend` means on this device for weights of `dtype` (None: fp32):
    "streamed", "prepacked", "onednn", "torch", or "cuda" (cuBLAS through F.linear)."""
    if device.type == "cuda":
        return "cuda"
    backend = config.linear_backend
    if backend in ("onednn", "prepacked", "streamed") and not torch.backends.mkldnn.is_available():
        raise ConfigError(f"--linear-backend {backend} needs a torch built with oneDNN (mkldnn); "
                          "use --linear-backend torch")
    if backend == "auto":
        if not torch.backends.mkldnn.is_available():
            return "torch"
        return "streamed" if auto_streams(dtype or torch.float32) else "onednn"
    return backend


def auto_streams(dtype: torch.dtype) -> bool:
    """Where `auto` puts weights of `dtype` on tts's streamed kernels (their stream beside
    the plain weight, which oneDNN serves the calls they do not take): bf16 on CPUs with
    AVX512-BF16, where the kernel measured 1.36x oneDNN on beam-shaped decode and 1.4x on
    search-and-learn-shaped search (docs/benchmarks/search_sal_settings.md); fp32 on CPUs
    with AVX2 and FMA but no AVX-512, where the fp32 kernel measured faster than oneDNN at
    every row count from 1 to 1024 (docs/benchmarks/linear_avx2.md). With AVX-512, fp32
    stays on oneDNN's own kernels."""
    if dtype == torch.bfloat16:
        return cpu_features.has("avx512_bf16")
    return dtype == torch.float32 and _fp32_kernel_applies() and not cpu_features.has("avx512f")


def packed_weight_bytes(model: nn.Module, samples: bool, device: torch.device, config: EngineConfig) -> int:
    """Bytes the prepacked and streamed backends add to a model's weights (packed copies):
    its projections, and the output layer where the engine samples."""
    weights = [m.weight for m in model.layers.modules() if isinstance(m, nn.Linear)]
    if samples:
        weights.append(model.output_weight)
    return sum(_packed_bytes(w, resolved_linear_backend(device, config, w.dtype), config) for w in weights)


def _packed_bytes(weight: torch.Tensor, backend: str, config: EngineConfig) -> int:
    """A prepacked copy; with `streamed`, a bf16 weight's stream (its own size), an fp32
    weight's stream (bf16 where `linear_bf16_weights`), or, for an fp32 weight the kernel
    cannot take, oneDNN's prepacked copy (none under `auto`, whose fallback is oneDNN on
    the plain weight)."""
    size = weight.numel() * weight.element_size()
    if backend not in ("prepacked", "streamed"):
        return 0
    if backend == "prepacked" or weight.dtype != torch.float32 or not _fp32_kernel_applies():
        return size
    if _fp32_streamable(weight):
        return weight.numel() * (2 if config.linear_bf16_weights else 4)
    return 0 if config.linear_backend == "auto" else size


def _fp32_kernel_applies() -> bool:
    from tts_runtime.executor.cpu.cpu_linear_fp32 import applies

    return applies()


def _fp32_streamable(weight: torch.Tensor) -> bool:
    from tts_runtime.executor.cpu.cpu_linear_fp32 import streamable

    return streamable(weight)


def layer_ops(device: torch.device, config: EngineConfig, models: Sequence[nn.Module]) -> LayerOps:
    """Fused Triton kernels on CUDA when `compile` is on; on the CPU the C++ elementwise ops
    (`cpu_fused_ops`, else torch's eager ops, bit-exact with HF) with the projections on
    oneDNN (prepacked or plain), tts's streamed bf16 kernel or torch (`linear_backend`)."""
    if device.type == "cuda":
        if config.compile:
            from tts_runtime.models.fused_ops import FUSED_OPS  # imports triton: CUDA only

            return FUSED_OPS
        return EAGER_OPS
    ops = cpu_elementwise_ops() if config.cpu_fused_ops else EAGER_OPS
    backends = {resolved_linear_backend(device, config, p.dtype) for model in models for p in model.parameters()}
    backend = "streamed" if "streamed" in backends else resolved_linear_backend(device, config)
    if backend == "torch":
        return ops
    if backend == "onednn":
        return replace(ops, linear=onednn_linear)
    if backend == "streamed" and config.linear_backend == "auto":  # no packed copy but the stream
        return replace(ops, linear=streamed_linear(models, onednn_linear, config.linear_bf16_weights, auto=True))
    prepacked = PrepackedLinear(models)
    if backend == "streamed":
        return replace(ops, linear=streamed_linear(models, prepacked, config.linear_bf16_weights))
    return replace(ops, linear=prepacked)


def streamed_linear(models: Sequence[nn.Module], fallback: LinearFn, bf16_weights: bool = False,
                    auto: bool = False) -> LinearFn:
    """tts's kernels over `fallback`: the AVX512-BF16 one for bf16 weights (on AMX CPUs for
    the few-row calls only), the AVX2/FMA one for fp32 weights (stored as bf16 where
    `bf16_weights`); each only where the models have such weights, and `fallback` alone
    (with a warning) where neither can be built or the CPU lacks what they need."""
    dtypes = {p.dtype for model in models for p in model.parameters()}
    linear = fallback
    # `auto` streams each dtype only where it wins (auto_streams); the others stay on the
    # fallback quietly.
    if torch.float32 in dtypes and not (auto and not auto_streams(torch.float32)):
        linear = _kernel_or(linear, "fp32", lambda: _fp32_streamed(models, fallback, bf16_weights))
    if torch.bfloat16 in dtypes and not (auto and not auto_streams(torch.bfloat16)):
        linear = _kernel_or(linear, "bf16", lambda: _bf16_streamed(models, linear))
    return linear


def _fp32_streamed(models: Sequence[nn.Module], fallback: LinearFn, bf16_weights: bool) -> LinearFn:
    from tts_runtime.executor.cpu.cpu_linear_fp32 import StreamedFp32Linear, load_fp32_linear_kernel

    return StreamedFp32Linear(load_fp32_linear_kernel(), models, fallback, bf16_weights)


def _bf16_streamed(models: Sequence[nn.Module], fallback: LinearFn) -> LinearFn:
    from tts_runtime.executor.cpu.cpu_linear import StreamedBf16Linear, load_linear_kernel, row_limit

    return StreamedBf16Linear(load_linear_kernel(), models, fallback, row_limit())


def _kernel_or(fallback: LinearFn, label: str, make: Callable[[], LinearFn]) -> LinearFn:
    try:
        return make()
    except KernelUnavailable as exc:
        log.warning("streamed %s linear kernel unavailable, using oneDNN on prepacked weights: %s", label, exc)
        return fallback


@functools.cache
def cpu_elementwise_ops() -> LayerOps:
    """The C++ layer ops, or the eager ones (with a warning, once) where they cannot be built."""
    from tts_runtime.executor.cpu.cpu_layer_ops import cpu_layer_ops, load_layer_ops_kernel

    try:
        return cpu_layer_ops(load_layer_ops_kernel())
    except KernelUnavailable as exc:
        log.warning("CPU layer-ops kernel unavailable, using torch's eager ops: %s", exc)
        return EAGER_OPS
