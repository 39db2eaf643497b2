"""Which elementwise layer ops an executor runs its model with."""

from __future__ import annotations

import torch

from tts_runtime.config import EngineConfig
from tts_runtime.models.layers import EAGER_OPS, LayerOps


def layer_ops(device: torch.device, config: EngineConfig) -> LayerOps:
    """Fused Triton kernels on CUDA when `compile` is on; the eager ops otherwise (the CPU
    path, bit-exact with HF)."""
    if device.type == "cuda" and config.compile:
        from tts_runtime.models.fused_ops import FUSED_OPS  # imports triton: CUDA only

        return FUSED_OPS
    return EAGER_OPS
