"""Building blocks shared by every architecture: RMSNorm, rotary embeddings, gated MLP."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tts_runtime.models.arch import RopeConfig


class RMSNorm(nn.Module):
    """Gemma stores the weight as an offset from 1 and scales in fp32 before casting;
    Llama casts first and then scales. Both orders matter for bit-parity with HF."""

    def __init__(self, dim: int, eps: float, gemma_style: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if gemma_style else torch.ones(dim))
        self.eps = eps
        self.gemma_style = gemma_style

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.gemma_style:
            return (h * (1.0 + self.weight.float())).type_as(x)
        return self.weight * h.to(x.dtype)


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


_ACTIVATIONS = {
    "silu": F.silu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int, activation: str) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unsupported activation '{activation}'")
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.activation = _ACTIVATIONS[activation]
        self.intermediate = intermediate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(self.activation(gate) * up)
