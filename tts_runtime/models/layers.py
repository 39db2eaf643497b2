"""Building blocks shared by every architecture: RMSNorm, rotary embeddings, gated MLP.

The elementwise pieces are plain functions collected in `LayerOps`; every forward takes
the `ops` to use, chosen by the executor that runs the model, so a GPU executor runs fused
kernels and a CPU one C++ loops (executor/cpu/cpu_layer_ops.py) or, switched off, these exact eager
ops (bit-parity with HF), on the same weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from tts_runtime.models.arch import RopeConfig


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma_style: bool) -> torch.Tensor:
    """Gemma stores the weight as an offset from 1 and scales in fp32 before casting;
    Llama casts first and then scales. Both orders matter for bit-parity with HF."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if gemma_style:
        return (h * (1.0 + weight.float())).type_as(x)
    return weight * h.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, gemma_style: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if gemma_style else torch.ones(dim))
        self.eps = eps
        self.gemma_style = gemma_style

    def forward(self, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps, self.gemma_style)


def _llama3_scaled(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = old_len / low, old_len / high
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.scaling is None:
        return inv_freq
    kind = rope.scaling.get("rope_type", rope.scaling.get("type"))
    if kind == "llama3":
        return _llama3_scaled(inv_freq, rope.scaling)
    if kind == "linear":
        return inv_freq / rope.scaling["factor"]
    raise ValueError(f"unsupported rope scaling '{kind}'")


def rotary_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, 1, head_dim] for the given positions (computed in fp32 like HF)."""
    freqs = positions.float().unsqueeze(-1) * inv_freq.unsqueeze(0)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim], rotate-half convention (HF layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rotary_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)


_ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


def act_and_mul(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """act(gate) * up for the fused [..., 2 * intermediate] gate/up projection."""
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    return _ACTIVATIONS[activation](gate) * up


# A projection: (x, weight, bias) -> x @ weight.T + bias, as F.linear.
LinearFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


@dataclass(frozen=True)
class LayerOps:
    """The ops of a layer, by the signatures of the eager functions above (and F.linear's for
    the projections and the output layer). Replacements may write `rotary_qk`'s q and k in
    place."""

    rms_norm: Callable[[torch.Tensor, torch.Tensor, float, bool], torch.Tensor]
    rotary_qk: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                        tuple[torch.Tensor, torch.Tensor]]
    act_and_mul: Callable[[torch.Tensor, str], torch.Tensor]
    linear: LinearFn = F.linear


EAGER_OPS = LayerOps(rms_norm, rotary_qk, act_and_mul)


def project(x: torch.Tensor, layer: nn.Linear, ops: LayerOps) -> torch.Tensor:
    return ops.linear(x, layer.weight, layer.bias)


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int, activation: str) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unsupported activation '{activation}'")
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.activation = activation

    def forward(self, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:
        return project(ops.act_and_mul(project(x, self.gate_up_proj, ops), self.activation), self.down_proj, ops)
