"""TritonAttention against TorchAttention on random paged batches.

Without CUDA the kernels run under the Triton interpreter at small sizes; the full-size
cases are marked ``gpu``. Error = max |triton - torch| / max |torch|, bounded per dtype
(see ``REL_TOL``); ``store_kv`` must match exactly.
"""

import os

import torch

if not torch.cuda.is_available():
    # Must precede the kernel module's import: @triton.jit picks the interpreter then.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from dataclasses import dataclass, field, fields, replace  # noqa: E402

import pytest  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

if not torch.cuda.is_available() and not isinstance(tl.sum, InterpretedFunction):
    # triton decides interpreter-or-compiler for its own library at import time, so an
    # earlier test module that imported triton before TRITON_INTERPRET was set leaves
    # nothing that can run here (setting it in tests/conftest.py avoids this).
    pytest.skip("triton was imported without TRITON_INTERPRET=1 and there is no GPU; "
                "run this module alone or set TRITON_INTERPRET=1", allow_module_level=True)

from tts_runtime.executor.attention.attention import TorchAttention  # noqa: E402
from tts_runtime.executor.batch import AttentionMetadata  # noqa: E402
from tts_runtime.executor.attention.triton_attention import TritonAttention  # noqa: E402

from tests.executor.attention_cases import CASES, build as build_shared  # noqa: E402
from tests.helpers import compile_kernels_for_sm90  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# fp32 accumulates in the same precision as the reference, so only summation order
# differs. 16-bit results are rounded to the output dtype (bf16 has an 8-bit mantissa,
# ~4e-3 relative per element) and probabilities are rounded before the PV product in
# both backends, at different points of the sum.
REL_TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}


@dataclass
class Case:
    dtype: torch.dtype = torch.float32
    block_size: int = 16
    num_heads: int = 4
    num_kv_heads: int = 4
    head_dim: int = 64
    decodes: list[int] = field(default_factory=list)  # context lengths, new token included
    prefills: list[tuple[int, int]] = field(default_factory=list)  # (context len, chunk len)
    window: int | None = None
    softcap: float | None = None
    backend: dict = field(default_factory=dict)  # TritonAttention overrides
    seed: int = 0


def build(case: Case):
    """Random caches (prefixes already filled), non-contiguous q/k/v views of one qkv
    tensor, shuffled block ids and metadata for `case`."""
    gen = torch.Generator().manual_seed(case.seed)
    bs = case.block_size
    ctxs = case.decodes + [c for c, _ in case.prefills]
    need = [-(-c // bs) for c in ctxs]
    num_blocks = sum(need) + 7  # spare blocks that no sequence owns
    ids = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    width = max(need) + 2  # wider than needed, like a padded batch table
    tables = torch.zeros(len(ctxs), width, dtype=torch.int32)
    used = 0
    for i, n in enumerate(need):
        tables[i, :n] = ids[used: used + n]
        used += n

    # Positions of the new tokens in the flat batch: each decode's last token, then
    # each chunk's last `qlen` tokens.
    seq_pos = [(i, c - 1) for i, c in enumerate(case.decodes)]
    for p, (c, q) in enumerate(case.prefills):
        seq_pos += [(len(case.decodes) + p, x) for x in range(c - q, c)]
    slots = torch.tensor([int(tables[i, x // bs]) * bs + x % bs for i, x in seq_pos], dtype=torch.int64)

    h, hkv, d = case.num_heads, case.num_kv_heads, case.head_dim
    qkv = torch.randn(len(seq_pos), h + 2 * hkv, d, generator=gen).to(case.dtype)
    query, key, value = qkv[:, :h], qkv[:, h: h + hkv], qkv[:, h + hkv:]
    k_cache = torch.randn(num_blocks, bs, hkv, d, generator=gen).to(case.dtype)
    v_cache = torch.randn(num_blocks, bs, hkv, d, generator=gen).to(case.dtype)

    nd = len(case.decodes)
    qlens = [q for _, q in case.prefills]
    starts = [nd + sum(qlens[:i]) for i in range(len(qlens))]
    meta = AttentionMetadata(
        slot_mapping=slots.to(DEVICE),
        num_decodes=nd,
        decode_block_tables=tables[:nd].to(DEVICE),
        decode_context_lens=torch.tensor(case.decodes, dtype=torch.int32).to(DEVICE),
        prefill_query_starts=starts,
        prefill_query_lens=qlens,
        prefill_context_lens=[c for c, _ in case.prefills],
        prefill_block_tables=tables[nd:].to(DEVICE),
        block_size=bs,
    )
    to = lambda t: t.to(DEVICE)  # noqa: E731
    return to(query), to(key), to(value), to(k_cache), to(v_cache), meta


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def check(case: Case) -> None:
    query, key, value, k_cache, v_cache, meta = build(case)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    torch_backend, triton_backend = TorchAttention(), TritonAttention(**case.backend)

    torch_backend.store_kv(key, value, ref_k, ref_v, meta.slot_mapping)
    triton_backend.store_kv(key, value, k_cache, v_cache, meta.slot_mapping)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)

    scale = case.head_dim ** -0.5
    ref = torch_backend.attend(query, ref_k, ref_v, meta, scale, case.window, case.softcap)
    out = triton_backend.attend(query, k_cache, v_cache, meta, scale, case.window, case.softcap)
    assert out.dtype == query.dtype and out.shape == query.shape
    assert torch.isfinite(out).all()
    nd = meta.num_decodes
    for name, sl in (("decode", slice(0, nd)), ("prefill", slice(nd, None))):
        if ref[sl].numel():
            err = rel_err(out[sl], ref[sl])
            assert err <= REL_TOL[case.dtype], f"{name} rel err {err:.2e} > {REL_TOL[case.dtype]:.0e}"


F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# Small enough for the interpreter. Chunk starts (ctx - qlen) land mid-block unless noted.
CPU_CASES = {
    "decode-mha-bs16": Case(decodes=[1, 17, 80, 32]),
    "decode-gqa3-bs8-window": Case(block_size=8, num_heads=9, num_kv_heads=3,
                                   decodes=[33, 80, 5, 21], window=20),
    "decode-gqa4-softcap-split3": Case(num_heads=8, num_kv_heads=2, decodes=[64, 79, 3],
                                       softcap=3.0, backend=dict(decode_splits=3)),
    "decode-gqa3-window-softcap-split2": Case(block_size=8, num_heads=6, num_kv_heads=2,
                                              decodes=[80, 50, 9], window=24, softcap=3.0,
                                              backend=dict(decode_splits=2)),
    "prefill-no-prefix": Case(prefills=[(40, 40), (7, 7)]),
    "prefill-prefix-gqa3-bs8": Case(block_size=8, num_heads=9, num_kv_heads=3,
                                    prefills=[(77, 30), (50, 3), (64, 16)]),  # 64-16: aligned
    "prefill-window-softcap-gqa4": Case(num_heads=8, num_kv_heads=2, prefills=[(80, 45), (30, 12)],
                                        window=16, softcap=3.0),
    "mixed-gqa3-window": Case(num_heads=6, num_kv_heads=2, decodes=[9, 70],
                              prefills=[(60, 21), (16, 16), (33, 1)], window=32),
    "mixed-small-tiles-bs8": Case(block_size=8, num_heads=4, num_kv_heads=1, decodes=[80, 15],
                                  prefills=[(75, 37), (20, 9)], window=13, softcap=2.0,
                                  backend=dict(block_m=16, block_n=16, decode_splits=4)),
    "mixed-block-larger-than-tile": Case(block_size=32, num_heads=4, num_kv_heads=2,
                                         decodes=[70, 33], prefills=[(80, 50)],
                                         backend=dict(block_m=16, block_n=16)),
    "mixed-head-dim-80": Case(head_dim=80, num_heads=4, num_kv_heads=2, decodes=[40],
                              prefills=[(45, 20)], softcap=3.0),
    "mixed-bf16-gqa4-softcap": Case(dtype=BF16, block_size=8, num_heads=8, num_kv_heads=2,
                                    decodes=[80, 41, 2], prefills=[(70, 23), (19, 19)], softcap=3.0,
                                    backend=dict(decode_splits=2)),
    "mixed-bf16-gqa3-window": Case(dtype=BF16, num_heads=9, num_kv_heads=3, decodes=[66, 12],
                                   prefills=[(80, 35)], window=20),
    "mixed-fp16-gqa3-window-softcap": Case(dtype=F16, num_heads=6, num_kv_heads=2,
                                           decodes=[57, 80], prefills=[(61, 26), (8, 2)],
                                           window=25, softcap=3.0),
}


@pytest.mark.parametrize("name", list(CPU_CASES))
def test_small(name):
    check(CPU_CASES[name])


def test_store_kv_skips_negative_slots():
    case = Case(decodes=[5, 9])
    _, key, value, k_cache, v_cache, meta = build(case)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    slots = meta.slot_mapping.clone()
    slots[1] = -1
    TritonAttention().store_kv(key, value, k_cache, v_cache, slots)
    flat = (-1, case.num_kv_heads, case.head_dim)
    expect_k, expect_v = before_k.view(flat).clone(), before_v.view(flat).clone()
    expect_k[int(slots[0])], expect_v[int(slots[0])] = key[0], value[0]
    assert torch.equal(k_cache.view(flat), expect_k)
    assert torch.equal(v_cache.view(flat), expect_v)


def _full_size(dtype, heads, kv_heads, head_dim, window=None, softcap=None, splits=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    decodes = torch.randint(1000, 4001, (64,), generator=gen).tolist()
    prefills = [(3000, 512), (1024, 1024), (2500, 77), (1800, 1)]
    return Case(dtype=dtype, block_size=16, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                decodes=decodes, prefills=prefills, window=window, softcap=softcap,
                backend={} if splits is None else dict(decode_splits=splits), seed=seed)


GPU_CASES = {
    "gemma3-270m-local": _full_size(BF16, 4, 1, 256, window=512),
    "gemma3-270m-global": _full_size(BF16, 4, 1, 256),
    "gemma3-270m-local-nosplit": _full_size(BF16, 4, 1, 256, window=512, splits=1),
    "llama-8b-shape": _full_size(BF16, 32, 8, 128),
    "llama-8b-shape-fp16-softcap": _full_size(F16, 32, 8, 128, softcap=50.0),
    "llama-1b-shape-fp32": _full_size(F32, 32, 8, 64),
    "smollm2-135m-shape": _full_size(BF16, 9, 3, 64, window=1024, softcap=30.0, splits=4),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_full_size(name):
    check(GPU_CASES[name])


# The interpreter accepts things the compiler rejects and cannot show register spills, so
# compile every kernel for sm_90 with the launch configs TritonAttention picks
# (evals/kernel_resources.py).
@pytest.mark.skipif(torch.cuda.is_available(), reason="the gpu cases compile and run the kernels")
def test_kernels_compile_for_sm90_and_spill_only_where_known():
    builds = compile_kernels_for_sm90("attention")
    assert {b["kernel"] for b in builds} == {"decode_kernel", "decode_reduce_kernel", "prefill_kernel",
                                             "cascade_kernel", "cascade_merge_kernel", "store_kv_kernel"}
    # TritonAttention.tile_sizes keeps every build in registers but the cascade kernel's at
    # head_dim 256 (40 bytes of stack; the fp32 one spilled 136 until its mask became _visible, 1a8d3a9).
    spilled = {(b["kernel"], b["config"]) for b in builds if b["stack_bytes"] != 0}
    assert spilled <= {("cascade_kernel", "bf16 d=256 group=4 window")}, spilled


def test_backend_reused_across_batches():
    """One backend object serves every layer and step: nothing may leak between calls."""
    torch_backend, triton_backend = TorchAttention(), TritonAttention()
    first = Case(num_heads=4, num_kv_heads=2, decodes=[20], prefills=[(40, 17)], seed=1)
    second = Case(num_heads=4, num_kv_heads=2, decodes=[33], prefills=[(40, 17), (9, 9)], seed=2)
    for case in (first, first, second):
        query, key, value, k_cache, v_cache, meta = build(case)
        triton_backend.store_kv(key, value, k_cache, v_cache, meta.slot_mapping)
        ref = torch_backend.attend(query, k_cache, v_cache, meta, 0.125, None, None)
        out = triton_backend.attend(query, k_cache, v_cache, meta, 0.125, None, None)
        assert rel_err(out, ref) <= REL_TOL[torch.float32]


# -- cascade: the attention plan's items over shared prefix blocks ------------------------
# Beam-shaped batches (tests/executor/attention_cases.py, shared with the CPU kernel's tests), cut
# to sizes the interpreter runs in seconds.
CASCADE_CASES = {name: CASES[name] for name in (
    "forks-of-one-prompt", "beams-diverging-at-different-blocks", "sequence-sharing-nothing",
    "sliding-window-gqa4-bs8", "softcap-window", "mixed-prefill-and-decode", "block-major-strided-pool", "bf16",
    "bf16-gemma-shape")}


def shared_case_on_device(case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """A tests/executor/attention_cases.py batch (built on the CPU) with every tensor, the metadata's
    too, on the GPU when there is one: compiled Triton kernels take device pointers only."""
    query, k_cache, v_cache, meta = build_shared(case)
    tensors = {f.name: getattr(meta, f.name).to(DEVICE) for f in fields(meta)
               if isinstance(getattr(meta, f.name), torch.Tensor)}
    return query.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), replace(meta, **tensors)


@pytest.mark.parametrize("name", list(CASCADE_CASES))
def test_cascade_matches_torch(name):
    case = CASCADE_CASES[name]
    query, k_cache, v_cache, meta = shared_case_on_device(case)
    scale = case.head_dim ** -0.5
    ref = TorchAttention().attend(query, k_cache, v_cache, meta, scale, case.window, case.softcap)
    backend = TritonAttention(cascade=True)
    out = backend.attend(query, k_cache, v_cache, meta, scale, case.window, case.softcap)
    assert backend.used_cascade, "the batch shares blocks: the cascade kernels must run"
    assert out.dtype == query.dtype and torch.isfinite(out).all()
    assert rel_err(out, ref) <= REL_TOL[case.dtype]


def test_cascade_leaves_batches_without_shared_blocks_to_the_flat_kernels():
    query, k_cache, v_cache, meta = shared_case_on_device(CASES["long-single-sequence"])
    backend = TritonAttention(cascade=True)
    backend.attend(query[:, :9], k_cache, v_cache, meta, 0.125, None, None)
    assert not backend.used_cascade
