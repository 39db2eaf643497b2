"""CPU paged attention that reads K/V in place in the block pool (csrc/paged_attention_cpu.cpp),
with shared-prefix (cascade) attention.

The torch backend copies every sequence's whole context out of the pool for every layer at
every step; on beam search's shape (few sequences, contexts of a few thousand tokens that the
beams of a problem share) that copy and the attention over it were half of a CPU run. This
backend plans each forward once, shared by all layers (attention_plan.py: items over the
block tables, a prefix tree of shared blocks with cascade on), and the kernel reads K/V in
place for decodes and for prefill chunks over a cached prefix (the PRM's score requests).

The kernel is compiled on first use (cpu_extensions.py); when it cannot be built,
`select_backend` falls back to the torch backend and says so once.
"""

from __future__ import annotations

import functools
from types import ModuleType

import torch

from tts_runtime.executor.attention.attention import AttentionBackend, store_kv
from tts_runtime.executor.attention.attention_plan import AttentionPlan, build_plan
from tts_runtime.executor.batch import AttentionMetadata
from tts_runtime.executor.cpu.cpu_extensions import load_extension


# The kernel's widest vector in fp32 lanes (AVX-512's; an AVX2 build's 8 divide it): head_dim
# must be a multiple of it, and at most the size of its per-lane accumulators.
HEAD_DIM_MULTIPLE = 16
MAX_HEAD_DIM = 256


@functools.cache
def load_kernel(march: str | None = None) -> ModuleType:
    """Builds (first call on a machine, tens of seconds) or loads the cached extension, for
    `march` (default: cpu_features.march()); raises KernelUnavailable when it cannot."""
    return load_extension("tts_paged_attention_cpu", "paged_attention_cpu.cpp", march=march)


class CpuPagedAttention:
    """The C++ paged-attention kernel; `cascade` turns shared-prefix attention on, `bf16_dot`
    the AVX512-BF16 dot products on a bf16 cache (where the build has them: `bf16_dot_available()`),
    `few_lanes` the score and value loops of lane groups of at most 4 query vectors (one
    decode row of a small GQA group), `prefetch_next_item` the prefetch of a thread's next item's
    first keys during its current item's last tile (a switch for the benchmark only: measured
    1.06x on beam search's decode, docs/benchmarks/beam_attention.md). Head sizes the kernel does
    not take (not a multiple of 16, or over 256) go to `fallback`. New K/V go into the pool
    through the kernel's own copy (4-8x torch's index_copy_ at a decode step's and a PRM chunk's
    size), where they already have the pool's dtype."""

    name = "cpu"

    def __init__(self, kernel: ModuleType, cascade: bool = True, fallback: AttentionBackend | None = None,
                 bf16_dot: bool = True, few_lanes: bool = True, prefetch_next_item: bool = True) -> None:
        self.kernel = kernel
        self.cascade = cascade
        self.bf16_dot = bf16_dot
        self.few_lanes = few_lanes
        self.prefetch_next_item = prefetch_next_item
        self.fallback = fallback
        # Every layer of a forward passes the same metadata: plan once per forward.
        self._plan_for: tuple[AttentionMetadata, AttentionPlan] | None = None

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        if key.dtype == k_cache.dtype and value.dtype == v_cache.dtype:
            self.kernel.store_kv(key, value, k_cache, v_cache, slot_mapping)
        else:
            store_kv(key, value, k_cache, v_cache, slot_mapping)

    def plan(self, meta: AttentionMetadata, num_tokens: int) -> AttentionPlan:
        if self._plan_for is None or self._plan_for[0] is not meta:
            self._plan_for = (meta, build_plan(meta, num_tokens, self.cascade))
        return self._plan_for[1]

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float, sliding_window: int | None,
               softcap: float | None) -> torch.Tensor:
        head_dim = query.shape[2]
        if (head_dim % HEAD_DIM_MULTIPLE or head_dim > MAX_HEAD_DIM) and self.fallback is not None:
            return self.fallback.attend(query, k_cache, v_cache, meta, scale, sliding_window, softcap)
        if query.stride(2) != 1 or query.stride(1) != query.shape[2]:
            query = query.contiguous()
        out = torch.empty(query.shape, dtype=query.dtype)
        if query.shape[0] == 0:
            return out
        p = self.plan(meta, query.shape[0])
        self.kernel.paged_attention(query, k_cache, v_cache, p.tables, p.items, p.rows, p.parts_ptr, p.parts,
                                    out, float(scale), float(softcap or 0.0), int(sliding_window or 0),
                                    self.bf16_dot, self.few_lanes, self.prefetch_next_item)
        return out
