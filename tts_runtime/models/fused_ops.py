"""Fused Triton kernels for a layer's elementwise ops: RMSNorm, rotary embedding and the
gated activation (SiLU / tanh-GELU times up). GPU engines route `LayerOps` here
(an executor passes `FUSED_OPS` to the forward); the CPU has its own (executor/cpu/cpu_layer_ops.py).

Each kernel reads its input once and writes its output once, where the eager versions
make several fp32 passes (RMSNorm: upcast, square, mean, scale, cast, weight; rotary:
negate, concatenate, two products, sum). They round where the eager code rounds (the
normalised row before the Llama weight, the activation before the product), so in 16-bit
they differ from it only by fp32 summation order. Inputs the kernels do not cover (other
ranks, strided last dims, other activations) go to the eager functions.

Imported only when fused ops are switched on: importing triton before
``TRITON_INTERPRET=1`` is set would keep CPU tests from running the kernels interpreted.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tts_runtime.models import layers
from tts_runtime.models.triton_options import LAUNCH_OPTIONS

# Activation name -> kernel switch.
_FUSED_ACTIVATIONS = {"silu": 0, "gelu_pytorch_tanh": 1}


@triton.jit
def rms_norm_kernel(x, weight, out, eps, s_xt, s_xh, s_ot, s_oh, DIM: tl.constexpr,
                    GEMMA: tl.constexpr, BLOCK: tl.constexpr):
    # One program per row: (token, head) for per-head norms, (token, 0) otherwise.
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < DIM
    row = tl.load(x + t * s_xt + h * s_xh + cols, mask=mask, other=0.0).to(tl.float32)
    normed = row * tl.math.rsqrt(tl.sum(row * row, 0) / DIM + eps)
    w = tl.load(weight + cols, mask=mask, other=0.0).to(tl.float32)
    if GEMMA:
        y = normed * (1.0 + w)
    else:  # Llama rounds the normalised row to the activation dtype before the weight
        y = w * normed.to(out.dtype.element_ty).to(tl.float32)
    tl.store(out + t * s_ot + h * s_oh + cols, y.to(out.dtype.element_ty), mask=mask)


@triton.jit
def act_and_mul_kernel(gate_up, out, s_gt, s_ot, INTERMEDIATE: tl.constexpr, ACTIVATION: tl.constexpr,
                       BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTERMEDIATE
    gate = tl.load(gate_up + t * s_gt + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up + t * s_gt + INTERMEDIATE + cols, mask=mask, other=0.0).to(tl.float32)
    if ACTIVATION == 0:
        act = gate / (1.0 + tl.exp(-gate))
    else:  # tanh-GELU; tanh(z) = 2 sigmoid(2z) - 1 saturates instead of overflowing
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        act = 0.5 * gate * (1.0 + (2.0 * tl.sigmoid(2.0 * z) - 1.0))
    # The eager op rounds the activation to the model dtype before the product.
    act = act.to(out.dtype.element_ty).to(tl.float32)
    tl.store(out + t * s_ot + cols, (act * up).to(out.dtype.element_ty), mask=mask)


@triton.jit
def _rotate_heads(x, t, cos1, sin1, cos2, sin2, s_t, s_h, NUM_HEADS: tl.constexpr, HALF: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_HALF)
    mask = (h[:, None] < NUM_HEADS) & (d[None, :] < HALF)
    first = x + t * s_t + h[:, None] * s_h + d[None, :]
    x1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    # Rotate-half (HF layout): [x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin].
    tl.store(first, (x1 * cos1[None, :] - x2 * sin1[None, :]).to(x.dtype.element_ty), mask=mask)
    tl.store(first + HALF, (x2 * cos2[None, :] + x1 * sin2[None, :]).to(x.dtype.element_ty), mask=mask)


@triton.jit
def rotary_kernel(q, k, cos, sin, s_qt, s_qh, s_kt, s_kh, s_ct, s_st,
                  NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HALF: tl.constexpr,
                  BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr):
    # One program per token rotates all its query and key heads in place.
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK_HALF)
    d_mask = d < HALF
    cos1 = tl.load(cos + t * s_ct + d, mask=d_mask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos + t * s_ct + HALF + d, mask=d_mask, other=0.0).to(tl.float32)
    sin1 = tl.load(sin + t * s_st + d, mask=d_mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin + t * s_st + HALF + d, mask=d_mask, other=0.0).to(tl.float32)
    _rotate_heads(q, t, cos1, sin1, cos2, sin2, s_qt, s_qh, NUM_Q_HEADS, HALF, BLOCK_HQ, BLOCK_HALF)
    _rotate_heads(k, t, cos1, sin1, cos2, sin2, s_kt, s_kh, NUM_K_HEADS, HALF, BLOCK_HK, BLOCK_HALF)


def warps_for(block: int) -> int:
    """Warps per program of the row kernels for a row tile of `block` elements."""
    return 4 if block <= 2048 else 8


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma_style: bool) -> torch.Tensor:
    """`layers.rms_norm` over [T, D] rows or per-head [T, H, D] rows."""
    # A Llama weight of another dtype promotes the eager output; keep that case eager.
    if x.dim() not in (2, 3) or x.stride(-1) != 1 or (not gemma_style and weight.dtype != x.dtype):
        return layers.rms_norm(x, weight, eps, gemma_style)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    dim = x.shape[-1]
    heads, s_xh, s_oh = (x.shape[1], x.stride(1), out.stride(1)) if x.dim() == 3 else (1, 0, 0)
    block = triton.next_power_of_2(dim)
    rms_norm_kernel[(x.shape[0], heads)](
        x, weight, out, float(eps), x.stride(0), s_xh, out.stride(0), s_oh,
        DIM=dim, GEMMA=gemma_style, BLOCK=block, num_warps=warps_for(block), **LAUNCH_OPTIONS,
    )
    return out


def rotary_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
              sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`layers.rotary_qk` for q [T, H, D], k [T, Hkv, D], cos/sin [T, 1, D]; rotates q
    and k in place (they are views of this forward's projection output) and returns them."""
    head_dim = q.shape[-1]
    if (q.dim() != 3 or k.dim() != 3 or head_dim % 2 or k.shape[-1] != head_dim
            or any(t.stride(-1) != 1 for t in (q, k, cos, sin))):
        return layers.rotary_qk(q, k, cos, sin)
    num_tokens = q.shape[0]
    if num_tokens == 0:
        return q, k
    half = head_dim // 2
    rotary_kernel[(num_tokens,)](
        q, k, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0), sin.stride(0),
        NUM_Q_HEADS=q.shape[1], NUM_K_HEADS=k.shape[1], HALF=half,
        BLOCK_HQ=triton.next_power_of_2(q.shape[1]), BLOCK_HK=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half), **LAUNCH_OPTIONS,
    )
    return q, k


def act_and_mul(gate_up: torch.Tensor, activation: str) -> torch.Tensor:
    """`layers.act_and_mul` over [T, 2 * intermediate]."""
    if activation not in _FUSED_ACTIVATIONS or gate_up.dim() != 2 or gate_up.stride(-1) != 1:
        return layers.act_and_mul(gate_up, activation)
    intermediate = gate_up.shape[1] // 2
    out = torch.empty(gate_up.shape[0], intermediate, dtype=gate_up.dtype, device=gate_up.device)
    if out.numel() == 0:
        return out
    block = min(1024, triton.next_power_of_2(intermediate))
    act_and_mul_kernel[(gate_up.shape[0], triton.cdiv(intermediate, block))](
        gate_up, out, gate_up.stride(0), out.stride(0),
        INTERMEDIATE=intermediate, ACTIVATION=_FUSED_ACTIVATIONS[activation], BLOCK=block, **LAUNCH_OPTIONS,
    )
    return out


FUSED_OPS = layers.LayerOps(rms_norm, rotary_qk, act_and_mul)
