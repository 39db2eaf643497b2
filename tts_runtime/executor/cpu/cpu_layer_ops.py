"""A layer's elementwise ops on the CPU as one C++ pass each (csrc/layer_ops_cpu.cpp):
RMSNorm, rotary embedding in place, and the gated activation times up.

Torch's eager versions (models/layers.py) take about a dozen torch ops per layer between
the projections; at the 16 rows of a beam-search decode step each op costs more in dispatch
than in arithmetic. The C++ loops round where the eager ops round, so in bf16 they differ
from them only by the norm's fp32 summation order and the activation's exp. Inputs they do
not cover (other ranks, strided last dims, dtypes other than fp32 and bf16, other
activations, a Llama norm weight of another dtype) go to the eager functions.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from tts_runtime.executor.cpu.cpu_extensions import load_extension
from tts_runtime.models import layers

# Activation name -> the kernel's switch.
_ACTIVATIONS = {"silu": 0, "gelu_pytorch_tanh": 1}
_DTYPES = (torch.float32, torch.bfloat16)


@functools.cache
def load_layer_ops_kernel(march: str | None = None) -> ModuleType:
    """Builds or loads the extension (for `march`, default cpu_features.march()); raises
    KernelUnavailable when it cannot. Built without contracting a product and a sum into one
    multiply-add: the eager ops round each."""
    return load_extension("tts_layer_ops_cpu", "layer_ops_cpu.cpp", ("-ffp-contract=off",), march=march)


def cpu_layer_ops(kernel: ModuleType) -> layers.LayerOps:
    """LayerOps on `kernel` (the projections on F.linear until the caller replaces them)."""

    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma_style: bool) -> torch.Tensor:
        if x.dim() not in (2, 3) or x.stride(-1) != 1 or x.dtype not in _DTYPES or weight.dtype != x.dtype:
            return layers.rms_norm(x, weight, eps, gemma_style)
        return kernel.rms_norm(x, weight.contiguous(), eps, gemma_style)

    def rotary_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tensors = (q, k, cos, sin)
        if (any(t.dim() != 3 or t.stride(-1) != 1 or t.dtype != q.dtype for t in tensors)
                or q.dtype not in _DTYPES or q.shape[-1] % 2):
            return layers.rotary_qk(q, k, cos, sin)
        kernel.rotary_qk(q, k, cos, sin)
        return q, k

    def act_and_mul(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
        if (activation not in _ACTIVATIONS or gate_up.dim() != 2 or gate_up.stride(-1) != 1
                or gate_up.dtype not in _DTYPES):
            return layers.act_and_mul(gate_up, activation)
        return kernel.act_and_mul(gate_up, _ACTIVATIONS[activation])

    return layers.LayerOps(rms_norm, rotary_qk, act_and_mul)
