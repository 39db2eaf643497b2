"""Which layer ops an executor runs its model with."""

from __future__ import annotations

from dataclasses import replace

import torch

from tts_runtime.config import ConfigError, EngineConfig
from tts_runtime.models.layers import EAGER_OPS, LayerOps


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear through oneDNN's matmul. For fp32, torch's F.linear calls MKL's sgemm,
    which on AMD CPUs runs a generic path several times slower at the row counts beam
    search decodes with; oneDNN's JIT kernels use the AVX-512 the CPU has."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def layer_ops(device: torch.device, config: EngineConfig) -> LayerOps:
    """Fused Triton kernels on CUDA when `compile` is on; on the CPU the eager elementwise
    ops (bit-exact with HF) with the projections on oneDNN or torch (`linear_backend`)."""
    if device.type == "cuda":
        if config.compile:
            from tts_runtime.models.fused_ops import FUSED_OPS  # imports triton: CUDA only

            return FUSED_OPS
        return EAGER_OPS
    backend = config.linear_backend
    if backend == "onednn" and not torch.backends.mkldnn.is_available():
        raise ConfigError("--linear-backend onednn needs a torch built with oneDNN (mkldnn); "
                          "use --linear-backend torch")
    if backend == "torch" or (backend == "auto" and not torch.backends.mkldnn.is_available()):
        return EAGER_OPS
    return replace(EAGER_OPS, linear=onednn_linear)
