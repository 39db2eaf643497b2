"""Triton paged-attention backend: KV store, decode and prefill-with-prefix kernels.

Same contract as ``TorchAttention`` (see ``attention.py``). Three kernels:

* ``store_kv_kernel``: one program per new token scatters its [Hkv, D] keys and
  values to ``slot_mapping``.
* ``decode_kernel``: one program per (sequence, kv head[, key split]). The query
  heads of the GQA group are the rows of the Q tile (padded to 16 for ``tl.dot``),
  so each K/V tile is read once per kv head whatever the group size (3 works).
  With ``num_splits > 1`` each program covers a slice of the keys and
  ``decode_reduce_kernel`` merges the partial softmaxes (flash-decoding), which
  keeps the GPU busy when batch * kv heads is small (Gemma-3-270M has 1 kv head).
* ``prefill_kernel``: flash-attention over (query tile, query head). Query tiles
  are described by a small host-built table, so one launch covers every chunk.

Keys are gathered per token (block table lookup of ``j // block_size``), so the key
tile size is independent of the cache block size: any power-of-two block size works,
also 8, which is below ``tl.dot``'s minimum of 16.

Scores use exp2 with log2(e) folded in; running max/sum and the accumulator are fp32.
Probabilities are cast to the value dtype before the PV product, as the reference does.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from tts_runtime.executor.attention.attention_plan import ROW_TILE, build_plan, shares_blocks
from tts_runtime.executor.attention.prefill_tiles import prefill_tile_table
from tts_runtime.executor.batch import AttentionMetadata
from tts_runtime.models.triton_options import LAUNCH_OPTIONS


@triton.jit
def _tanh(x):
    # tl has no tanh; this form saturates to +-1 instead of overflowing.
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _dot(a, b, F32_DOT: tl.constexpr, PRECISION: tl.constexpr):
    if F32_DOT:
        # 16-bit x 16-bit products are exact in fp32, so this matches the tensor cores.
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        out = tl.dot(a, b, input_precision=PRECISION)
    return out


@triton.jit
def _scores(q, k, scale, softcap, USE_SOFTCAP: tl.constexpr, F32_DOT: tl.constexpr,
            PRECISION: tl.constexpr):
    """q [M, D] . k [N, D]^T -> scaled (and soft-capped) scores in log2 units, fp32."""
    s = _dot(q, tl.trans(k), F32_DOT, PRECISION) * scale
    if USE_SOFTCAP:
        s = softcap * _tanh(s / softcap)
    return s * 1.4426950408889634


@triton.jit
def _load_kv_tile(table, k_cache, v_cache, j, j_mask, kv_off, d_mask, s_cb, s_cs, dtype: tl.constexpr,
                  BLOCK_SIZE: tl.constexpr):
    """The keys and values of context positions `j` (zeros where `j_mask` is off), read
    through the sequence's block `table` from the paged caches, in `dtype`."""
    block = tl.load(table + j // BLOCK_SIZE, mask=j_mask, other=0).to(tl.int64)
    offs = (block * s_cb + (j % BLOCK_SIZE) * s_cs)[:, None] + kv_off
    kv_mask = j_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache + offs, mask=kv_mask, other=0.0).to(dtype)
    v = tl.load(v_cache + offs, mask=kv_mask, other=0.0).to(dtype)
    return k, v


@triton.jit
def _visible(j, j_mask, pos, window, USE_WINDOW: tl.constexpr):
    """Which keys `j` each query at position `pos` sees: in range, not in its future and,
    with a sliding window, within its last `window` positions."""
    visible = j_mask[None, :] & (j[None, :] <= pos[:, None])
    if USE_WINDOW:
        visible = visible & (j[None, :] > pos[:, None] - window)
    return visible


@triton.jit
def _masked_softmax_step(s, v, m_i, l_i, acc, F32_DOT: tl.constexpr, PRECISION: tl.constexpr):
    """One tile of online softmax (log2 scores `s`, -inf where masked) into the running max
    `m_i`, sum `l_i` and output `acc`. A row may see no key of a tile (causal future, before
    its window, or none of the whole item): its max stays -inf, and 0 is subtracted instead
    of -inf so its p stays 0 rather than NaN."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, F32_DOT, PRECISION)
    return m_new, l_i, acc


@triton.jit
def store_kv_kernel(
    key, value, k_cache, v_cache, slot_mapping,
    s_kt, s_kh, s_kd, s_vt, s_vh, s_vd,
    s_cb, s_cs, s_ch, s_cd,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping + t).to(tl.int64)
    # Negative slots are padding tokens (e.g. a padded CUDA-graph batch): skip them.
    if slot >= 0:
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM)
        k = tl.load(key + t * s_kt + h[:, None] * s_kh + d[None, :] * s_kd, mask=mask)
        v = tl.load(value + t * s_vt + h[:, None] * s_vh + d[None, :] * s_vd, mask=mask)
        dst = ((slot // BLOCK_SIZE) * s_cb + (slot % BLOCK_SIZE) * s_cs
               + h[:, None] * s_ch + d[None, :] * s_cd)
        tl.store(k_cache + dst, k, mask=mask)
        tl.store(v_cache + dst, v, mask=mask)


@triton.jit
def decode_kernel(
    query, k_cache, v_cache, block_tables, context_lens,
    out, part_acc, part_m, part_l,
    scale, softcap, window,
    s_qt, s_qh, s_qd,
    s_cb, s_cs, s_ch, s_cd,
    s_bt,
    s_ot, s_oh, s_od,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr, USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    heads = kv_head * GROUP + g
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    q = tl.load(query + seq.to(tl.int64) * s_qt + heads[:, None] * s_qh + d[None, :] * s_qd,
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    ctx = tl.load(context_lens + seq)
    start = 0
    if USE_WINDOW:
        start = tl.maximum(ctx - window, 0)  # keys j > (ctx - 1) - window
    first_tile = start // BLOCK_N
    num_tiles = tl.cdiv(ctx, BLOCK_N) - first_tile
    tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
    tile_lo = first_tile + split * tiles_per_split
    tile_hi = tl.minimum(tile_lo + tiles_per_split, first_tile + num_tiles)

    table = block_tables + seq.to(tl.int64) * s_bt
    kv_off = kv_head * s_ch + d[None, :] * s_cd
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    for tile in range(tile_lo, tile_hi):
        j = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        j_mask = (j >= start) & (j < ctx)
        k, v = _load_kv_tile(table, k_cache, v_cache, j, j_mask, kv_off, d_mask, s_cb, s_cs, q.dtype, BLOCK_SIZE)

        s = _scores(q, k, scale, softcap, USE_SOFTCAP, F32_DOT, PRECISION)
        s = tl.where(j_mask[None, :], s, float("-inf"))
        # Every tile holds at least one visible key, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, F32_DOT, PRECISION)
        m_i = m_new

    if NUM_SPLITS == 1:
        o = acc / l_i[:, None]
        tl.store(out + seq.to(tl.int64) * s_ot + heads[:, None] * s_oh + d[None, :] * s_od,
                 o.to(out.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])
    else:
        # Partials are [T, H, NUM_SPLITS, (BLOCK_D)] contiguous fp32; an empty split
        # leaves m = -inf, l = 0, acc = 0, which the reduction weighs as zero.
        row = (seq * (GROUP * tl.num_programs(1)) + heads).to(tl.int64) * NUM_SPLITS + split
        tl.store(part_m + row, m_i, mask=g_mask)
        tl.store(part_l + row, l_i, mask=g_mask)
        tl.store(part_acc + row[:, None] * BLOCK_D + d[None, :], acc, mask=g_mask[:, None])


@triton.jit
def decode_reduce_kernel(
    part_acc, part_m, part_l, out,
    s_ot, s_oh, s_od,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    sp = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    row = (seq * NUM_HEADS + head).to(tl.int64) * NUM_SPLITS + sp
    s_mask = sp < NUM_SPLITS
    m = tl.load(part_m + row, mask=s_mask, other=float("-inf"))
    l = tl.load(part_l + row, mask=s_mask, other=0.0)
    acc = tl.load(part_acc + row[:, None] * BLOCK_D + d[None, :], mask=s_mask[:, None], other=0.0)
    m_max = tl.max(m, 0)  # finite: the split holding the last key is never empty
    w = tl.exp2(m - m_max)
    o = tl.sum(acc * w[:, None], 0) / tl.sum(l * w, 0)
    tl.store(out + seq.to(tl.int64) * s_ot + head * s_oh + d * s_od, o.to(out.dtype.element_ty),
             mask=d < HEAD_DIM)


@triton.jit
def prefill_kernel(
    query, k_cache, v_cache, block_tables, tiles,
    out,
    scale, softcap, window,
    s_qt, s_qh, s_qd,
    s_cb, s_cs, s_ch, s_cd,
    s_bt,
    s_ot, s_oh, s_od,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    tile_id = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // GROUP

    # Tile descriptor, see TritonAttention._prefill_tiles.
    desc = tiles + tile_id * 4
    chunk = tl.load(desc)
    q_start = tl.load(desc + 1)
    num_rows = tl.load(desc + 2)
    pos0 = tl.load(desc + 3)

    r = tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    r_mask = r < num_rows
    d_mask = d < HEAD_DIM
    # Padding rows take the last row's position, so none of them sees zero keys (0/0).
    pos = pos0 + tl.minimum(r, num_rows - 1)
    q_rows = (q_start + r).to(tl.int64)
    q = tl.load(query + q_rows[:, None] * s_qt + head * s_qh + d[None, :] * s_qd,
                mask=r_mask[:, None] & d_mask[None, :], other=0.0)

    # Causality bounds the keys by the tile's last query; the window by its first.
    end = pos0 + num_rows
    start = 0
    if USE_WINDOW:
        start = tl.maximum(pos0 - window + 1, 0)

    table = block_tables + chunk.to(tl.int64) * s_bt
    kv_off = kv_head * s_ch + d[None, :] * s_cd
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for k0 in range((start // BLOCK_N) * BLOCK_N, end, BLOCK_N):
        j = k0 + tl.arange(0, BLOCK_N)
        j_mask = (j >= start) & (j < end)
        k, v = _load_kv_tile(table, k_cache, v_cache, j, j_mask, kv_off, d_mask, s_cb, s_cs, q.dtype, BLOCK_SIZE)

        s = _scores(q, k, scale, softcap, USE_SOFTCAP, F32_DOT, PRECISION)
        s = tl.where(_visible(j, j_mask, pos, window, USE_WINDOW), s, float("-inf"))
        m_i, l_i, acc = _masked_softmax_step(s, v, m_i, l_i, acc, F32_DOT, PRECISION)

    o = acc / l_i[:, None]
    tl.store(out + q_rows[:, None] * s_ot + head * s_oh + d[None, :] * s_od,
             o.to(out.dtype.element_ty), mask=r_mask[:, None] & d_mask[None, :])


# The interpreter multiplies bf16 tiles as raw uint16 bits (triton 3.9), so under it
# the kernels upcast dot operands to fp32 (see _dot).
_INTERPRETED = isinstance(decode_kernel, InterpretedFunction)


@triton.jit
def cascade_kernel(
    query, k_cache, v_cache, tables, items, rows,
    part_acc, part_m, part_l,
    scale, softcap, window,
    s_qt, s_qh, s_qd,
    s_cb, s_cs, s_ch, s_cd,
    s_bt,
    NUM_HEADS: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    F32_DOT: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program per (plan item, kv head, chunk of BLOCK_R of the item's query rows): the
    item's keys are read once for every row (query token x GQA head) of the tile, and each
    row's partial softmax is stored under its plan entry for `cascade_merge_kernel`."""
    item = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.load(items + item * 5)
    key_lo = tl.load(items + item * 5 + 1)
    key_hi = tl.load(items + item * 5 + 2)
    first = tl.load(items + item * 5 + 3) + tl.program_id(2) * BLOCK_R
    row_end = tl.load(items + item * 5 + 4)
    if first < row_end:
        m_idx = tl.arange(0, BLOCK_R * BLOCK_G)
        entry = first + m_idx // BLOCK_G
        g = m_idx % BLOCK_G
        has_row = entry < row_end
        heads = kv_head * GROUP + g
        valid = has_row & (g < GROUP)
        d = tl.arange(0, BLOCK_D)
        d_mask = d < HEAD_DIM
        token = tl.load(rows + entry * 2, mask=has_row, other=0).to(tl.int64)
        pos = tl.load(rows + entry * 2 + 1, mask=has_row, other=-1)
        q = tl.load(query + token[:, None] * s_qt + heads[:, None] * s_qh + d[None, :] * s_qd,
                    mask=valid[:, None] & d_mask[None, :], other=0.0)
        hi = tl.minimum(key_hi, tl.max(pos, 0) + 1)  # no row sees a key past its own position
        lo = key_lo
        if USE_WINDOW:
            lowest = tl.min(tl.where(has_row, pos, hi), 0)
            lo = tl.maximum(key_lo, lowest - window + 1)

        table = tables + seq.to(tl.int64) * s_bt
        kv_off = kv_head * s_ch + d[None, :] * s_cd
        m_i = tl.full([BLOCK_R * BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_R * BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_R * BLOCK_G, BLOCK_D], tl.float32)
        for tile in range(lo // BLOCK_N, tl.cdiv(hi, BLOCK_N)):
            j = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            j_mask = (j >= lo) & (j < hi)
            k, v = _load_kv_tile(table, k_cache, v_cache, j, j_mask, kv_off, d_mask, s_cb, s_cs, q.dtype,
                                 BLOCK_SIZE)

            s = _scores(q, k, scale, softcap, USE_SOFTCAP, F32_DOT, PRECISION)
            s = tl.where(_visible(j, j_mask, pos, window, USE_WINDOW), s, float("-inf"))
            m_i, l_i, acc = _masked_softmax_step(s, v, m_i, l_i, acc, F32_DOT, PRECISION)

        row = entry.to(tl.int64) * NUM_HEADS + heads
        tl.store(part_m + row, m_i, mask=valid)
        tl.store(part_l + row, l_i, mask=valid)
        tl.store(part_acc + row[:, None] * BLOCK_D + d[None, :], acc, mask=valid[:, None])


@triton.jit
def cascade_merge_kernel(
    part_acc, part_m, part_l, parts_ptr, parts, out,
    s_ot, s_oh, s_od,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """One program per (token, head): log-sum-exp merge of the token's entries (one per
    prefix-tree node on its path and key split)."""
    token = tl.program_id(0)
    head = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    m_run = float("-inf")
    l_run = 0.0
    acc = tl.zeros([BLOCK_D], tl.float32)
    for e in range(tl.load(parts_ptr + token), tl.load(parts_ptr + token + 1)):
        row = tl.load(parts + e).to(tl.int64) * NUM_HEADS + head
        m_e = tl.load(part_m + row)
        m_new = tl.maximum(m_run, m_e)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        w_run = tl.exp2(m_run - m_safe)
        w_e = tl.exp2(m_e - m_safe)
        l_run = l_run * w_run + tl.load(part_l + row) * w_e
        acc = acc * w_run + tl.load(part_acc + row * BLOCK_D + d) * w_e
        m_run = m_new
    tl.store(out + token.to(tl.int64) * s_ot + head * s_oh + d * s_od, (acc / l_run).to(out.dtype.element_ty),
             mask=d < HEAD_DIM)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _device_table(table: torch.Tensor, device: torch.device) -> torch.Tensor:
    table = table.to(device, non_blocking=True)
    return table if table.stride(1) == 1 else table.contiguous()  # kernels index rows densely


class TritonAttention:
    """Paged attention with Triton kernels (GPU; CPU tensors under TRITON_INTERPRET=1).

    ``decode_splits``: key splits per decode sequence (None: chosen from the batch
    shape and the device's SM count). ``block_m``/``block_n``: override the query/key
    tile sizes (powers of two >= 16), mainly for tests. ``cascade``: when a batch holds
    sequences sharing prefix blocks, run it as the attention plan's items (shared blocks
    read once for all their sequences, merged by log-sum-exp) instead of the flat kernels.
    """

    name = "triton"

    def __init__(self, decode_splits: int | None = None, block_m: int | None = None,
                 block_n: int | None = None, cascade: bool = False) -> None:
        self.decode_splits = decode_splits
        self.block_m = block_m
        self.block_n = block_n
        self.cascade = cascade
        self._plan_for: tuple[AttentionMetadata, tuple[torch.Tensor, ...] | None] | None = None
        # Every layer of a forward passes the same chunks: build the prefill tile
        # table (host work and a copy) once per forward, not once per layer.
        self._tiles_for: tuple | None = None  # (key, tiles)

    @property
    def used_cascade(self) -> bool:
        """The last forward's batch shared KV blocks and ran on the cascade kernels."""
        return self._plan_for is not None and self._plan_for[1] is not None

    # -- store ---------------------------------------------------------------

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        num_tokens, num_kv_heads, head_dim = key.shape
        if num_tokens == 0:
            return
        assert k_cache.stride() == v_cache.stride(), "k_cache and v_cache must share a layout"
        store_kv_kernel[(num_tokens,)](
            key, value, k_cache, v_cache, slot_mapping,
            *key.stride(), *value.stride(), *k_cache.stride(),
            NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=k_cache.shape[1],
            BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
            **LAUNCH_OPTIONS,
        )

    # -- attend --------------------------------------------------------------

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float, sliding_window: int | None,
               softcap: float | None) -> torch.Tensor:
        num_heads, head_dim = query.shape[1], query.shape[2]
        num_kv_heads = k_cache.shape[2]
        assert num_heads % num_kv_heads == 0, "num_heads must be a multiple of num_kv_heads"
        assert k_cache.shape[3] == head_dim and k_cache.stride() == v_cache.stride()
        assert k_cache.shape[1] == meta.block_size
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        scalars = (float(scale), float(softcap) if softcap is not None else 1.0,
                   int(sliding_window) if sliding_window is not None else 0)
        constants = dict(
            GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, BLOCK_SIZE=meta.block_size,
            USE_WINDOW=sliding_window is not None, USE_SOFTCAP=softcap is not None,
            BLOCK_D=triton.next_power_of_2(head_dim), F32_DOT=_INTERPRETED,
            # Plain fp32 (the parity dtype) must not silently drop to tf32.
            PRECISION="ieee" if query.dtype == torch.float32 else None,
        )
        plan = self._cascade_plan(meta, query.shape[0], query.device) if self.cascade else None
        if plan is not None:
            self._cascade(query, k_cache, v_cache, plan, out, scalars, constants)
            return out
        if meta.num_decodes:
            self._decode(query, k_cache, v_cache, meta, out, scalars, constants)
        if meta.num_prefills or meta.prefill_tiles is not None:
            self._prefill(query, k_cache, v_cache, meta, out, scalars, constants)
        return out

    def tile_sizes(self, head_dim: int, dtype: torch.dtype) -> tuple[int, int, int]:
        """(block_m, block_n, num_warps) for the prefill kernel; decode uses the same
        key tile. Chosen so that sm_90 builds fit in registers without spilling, the cascade
        kernel at head_dim 256 aside (40 bytes of stack; `python -m evals.kernel_resources`
        shows each build's registers and spills). Checked with ptxas, not timed: tune on a GPU."""
        if dtype == torch.float32:  # parity runs only; fp32 tiles are twice as big
            block_m, block_n = 32, 32
        else:
            block_m, block_n = 64, (64 if head_dim <= 128 else 32)
        return self.block_m or block_m, self.block_n or block_n, (4 if head_dim <= 64 else 8)

    def _num_splits(self, num_programs: int, max_keys: int, device: torch.device) -> int:
        if self.decode_splits is not None:
            return self.decode_splits
        if device.type != "cuda":
            return 1
        sms = _sm_count(device)
        if num_programs >= sms:
            return 1
        # Enough programs to fill the SMs twice, but at least ~256 keys per split.
        return max(1, min(triton.cdiv(2 * sms, num_programs), max_keys // 256, 16))

    def _decode(self, query, k_cache, v_cache, meta: AttentionMetadata, out, scalars, constants) -> None:
        nd = meta.num_decodes
        num_heads, head_dim = query.shape[1], query.shape[2]
        num_kv_heads = k_cache.shape[2]
        tables = _device_table(meta.decode_block_tables, query.device)
        lens = meta.decode_context_lens.to(query.device, non_blocking=True)
        # The table width bounds the context without reading lens back to the host.
        max_keys = tables.shape[1] * meta.block_size
        if constants["USE_WINDOW"]:
            max_keys = min(max_keys, scalars[2])
        splits = self._num_splits(nd * num_kv_heads, max_keys, query.device)
        block_d = constants["BLOCK_D"]
        _, block_n, num_warps = self.tile_sizes(head_dim, query.dtype)
        if splits > 1:
            part_acc = torch.empty(nd, num_heads, splits, block_d, dtype=torch.float32,
                                   device=query.device)
            part_m = torch.empty(nd, num_heads, splits, dtype=torch.float32, device=query.device)
            part_l = torch.empty_like(part_m)
        else:
            part_acc = part_m = part_l = out  # unused
        decode_kernel[(nd, num_kv_heads, splits)](
            query, k_cache, v_cache, tables, lens, out, part_acc, part_m, part_l, *scalars,
            *query.stride(), *k_cache.stride(), tables.stride(0), *out.stride(),
            NUM_SPLITS=splits, BLOCK_G=max(16, triton.next_power_of_2(constants["GROUP"])),
            BLOCK_N=block_n, num_warps=num_warps, **constants, **LAUNCH_OPTIONS,
        )
        if splits > 1:
            decode_reduce_kernel[(nd, num_heads)](
                part_acc, part_m, part_l, out, *out.stride(),
                NUM_HEADS=num_heads, HEAD_DIM=head_dim, NUM_SPLITS=splits,
                BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d, **LAUNCH_OPTIONS,
            )

    # -- cascade -------------------------------------------------------------

    def _cascade_plan(self, meta: AttentionMetadata, num_tokens: int,
                      device: torch.device) -> tuple[torch.Tensor, ...] | None:
        """The plan's tensors on the device, once per forward; None when no two sequences
        share a block (the flat kernels then do the same work with fewer launches)."""
        if self._plan_for is None or self._plan_for[0] is not meta:
            on_device = None
            if shares_blocks(meta):
                plan = build_plan(meta, num_tokens, cascade=True)
                on_device = tuple(t.to(device) for t in (plan.tables, plan.items, plan.rows, plan.parts_ptr,
                                                         plan.parts))
            self._plan_for = (meta, on_device)
        return self._plan_for[1]

    def _cascade(self, query, k_cache, v_cache, plan: tuple[torch.Tensor, ...], out, scalars, constants) -> None:
        tables, items, rows, parts_ptr, parts = plan
        num_tokens, num_heads, head_dim = query.shape
        block_d, group = constants["BLOCK_D"], constants["GROUP"]
        block_g = triton.next_power_of_2(group)
        block_r = max(1, 64 // block_g)  # 64 query rows (tokens x heads) per tile
        _, block_n, num_warps = self.tile_sizes(head_dim, query.dtype)
        entries = rows.shape[0]
        part_acc = torch.empty(entries, num_heads, block_d, dtype=torch.float32, device=query.device)
        part_m = torch.empty(entries, num_heads, dtype=torch.float32, device=query.device)
        part_l = torch.empty_like(part_m)
        cascade_kernel[(items.shape[0], k_cache.shape[2], triton.cdiv(ROW_TILE, block_r))](
            query, k_cache, v_cache, tables, items, rows, part_acc, part_m, part_l, *scalars,
            *query.stride(), *k_cache.stride(), tables.stride(0),
            NUM_HEADS=num_heads, BLOCK_R=block_r, BLOCK_G=block_g, BLOCK_N=block_n, num_warps=num_warps,
            **constants, **LAUNCH_OPTIONS,
        )
        cascade_merge_kernel[(num_tokens, num_heads)](
            part_acc, part_m, part_l, parts_ptr, parts, out, *out.stride(),
            NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_D=block_d, **LAUNCH_OPTIONS,
        )

    def _cached_prefill_tiles(self, meta: AttentionMetadata, block_m: int, device: torch.device) -> torch.Tensor:
        """The batch's tile table on the device, built once per forward (every layer passes the
        same chunks)."""
        key = (tuple(meta.prefill_query_starts), tuple(meta.prefill_query_lens),
               tuple(meta.prefill_context_lens), block_m, device)
        if self._tiles_for is None or self._tiles_for[0] != key:
            tiles = prefill_tile_table(meta.prefill_query_lens, meta.prefill_query_starts,
                                       meta.prefill_context_lens, block_m)
            tiles = tiles.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else tiles.to(device)
            self._tiles_for = (key, tiles)
        return self._tiles_for[1]

    def _prefill(self, query, k_cache, v_cache, meta: AttentionMetadata, out, scalars, constants) -> None:
        block_m, block_n, num_warps = self.tile_sizes(query.shape[2], query.dtype)
        if meta.prefill_tiles is not None:  # a score graph's static table (its padding tiles are empty)
            tiles = meta.prefill_tiles
        else:
            tiles = self._cached_prefill_tiles(meta, block_m, query.device)
        if tiles.shape[0] == 0:  # only empty chunks
            return
        tables = _device_table(meta.prefill_block_tables, query.device)
        prefill_kernel[(tiles.shape[0], query.shape[1])](
            query, k_cache, v_cache, tables, tiles, out, *scalars,
            *query.stride(), *k_cache.stride(), tables.stride(0), *out.stride(),
            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=num_warps, **constants, **LAUNCH_OPTIONS,
        )
