"""Paged attention backends: the interface, and the torch backend (CPU and reference).

Backends read `AttentionMetadata` (executor/batch.py, which also describes the KV layout
and the flat varlen batch). Which backend runs is chosen in attention/backends.py; this
module imports no backend, so the backends can import it."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F

from tts_runtime.executor.batch import AttentionMetadata, DecodeGroup, whole_decode_batch


class AttentionBackend(Protocol):
    name: str

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None: ...

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float, sliding_window: int | None,
               softcap: float | None) -> torch.Tensor: ...


def allowed_keys_mask(query_positions: torch.Tensor, key_positions: torch.Tensor,
                      context_lens: torch.Tensor, sliding_window: int | None) -> torch.Tensor:
    """Boolean mask [..., q, k]: causal, inside the context, inside the sliding window.

    query_positions [B, q], key_positions [k], context_lens [B]."""
    q = query_positions.unsqueeze(-1)
    k = key_positions.view(1, 1, -1)
    mask = (k <= q) & (k < context_lens.view(-1, 1, 1))
    if sliding_window is not None:
        mask &= k > q - sliding_window
    return mask


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float, softcap: float | None) -> torch.Tensor:
    """q [B, H, q, D], k/v [B, Hkv, k, D], mask [B, q, k] -> [B, H, q, D]."""
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1), scale=scale,
                                              enable_gqa=k.shape[1] != q.shape[1])
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    return torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)


def store_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Writes the new tokens' K/V [T, Hkv, D] to their slots (the CPU backends' store)."""
    if k_cache.is_contiguous():
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value.to(v_cache.dtype))
        return
    # Block-major shared pools (kv_cache.shared_kv_views) are strided over blocks.
    blocks, offsets = slot_mapping // k_cache.shape[1], slot_mapping % k_cache.shape[1]
    k_cache[blocks, offsets] = key.to(k_cache.dtype)
    v_cache[blocks, offsets] = value.to(v_cache.dtype)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[B, max_blocks] block ids -> [B, Hkv, num_tokens, D] keys or values."""
    b, nb = block_tables.shape
    # index_select copies whole blocks and is several times faster than advanced indexing on CPU.
    blocks = cache.index_select(0, block_tables.reshape(-1).long())
    return blocks.view(b, nb * cache.shape[1], *cache.shape[2:])[:, :num_tokens].transpose(1, 2)


class TorchAttention:
    """Reference backend for CPU and for testing GPU kernels against.

    Decodes are padded to a common context length and gathered out of the paged cache;
    with `group_decodes_by_length` they run in groups of similar length instead of one
    batch padded to the longest (on a batch of mixed prompt lengths the gather and the
    attention over padding dominate a CPU decode step)."""

    name = "torch"

    def __init__(self, group_decodes_by_length: bool = True) -> None:
        self.group_decodes_by_length = group_decodes_by_length

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        store_kv(key, value, k_cache, v_cache, slot_mapping)

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float, sliding_window: int | None,
               softcap: float | None) -> torch.Tensor:
        out = torch.empty_like(query)
        nd = meta.num_decodes
        if nd:
            groups = meta.decode_length_groups if self.group_decodes_by_length else [whole_decode_batch(meta)]
            for group in groups:
                out[group.rows] = self._decode(query[group.rows], k_cache, v_cache, group, scale,
                                               sliding_window, softcap)
        for i in range(meta.num_prefills):
            start, qlen = meta.prefill_query_starts[i], meta.prefill_query_lens[i]
            ctx = meta.prefill_context_lens[i]
            table = meta.prefill_block_tables[i: i + 1, : -(-ctx // meta.block_size)]
            k = gather_kv(k_cache, table, ctx)
            v = gather_kv(v_cache, table, ctx)
            q = query[start: start + qlen].transpose(0, 1).unsqueeze(0)
            positions = torch.arange(ctx - qlen, ctx, device=query.device).unsqueeze(0)
            keys = torch.arange(ctx, device=query.device)
            lens = torch.tensor([ctx], device=query.device)
            mask = allowed_keys_mask(positions, keys, lens, sliding_window)
            out[start: start + qlen] = _masked_attention(q, k, v, mask, scale, softcap)[0].transpose(0, 1)
        return out

    @staticmethod
    def _decode(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, group: DecodeGroup,
                scale: float, sliding_window: int | None, softcap: float | None) -> torch.Tensor:
        table, lens, max_len = group.block_tables, group.context_lens, group.max_len
        k = gather_kv(k_cache, table, max_len)
        v = gather_kv(v_cache, table, max_len)
        positions = (lens - 1).long().unsqueeze(1)
        keys = torch.arange(max_len, device=query.device)
        mask = allowed_keys_mask(positions, keys, lens, sliding_window)
        if softcap is not None:
            return _masked_attention(query.unsqueeze(2), k, v, mask, scale, softcap).squeeze(2)
        # One query per sequence, so the heads sharing a KV head can stand in the query-length
        # axis: [B, Hkv, group, D] against unexpanded K/V. SDPA's GQA path expands K and V to
        # every query head first (about a third of the decode SDPA time in a CPU micro-benchmark).
        b, heads, dim = query.shape
        q = query.view(b, k.shape[1], heads // k.shape[1], dim)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1), scale=scale)
        return out.reshape(b, heads, dim)
