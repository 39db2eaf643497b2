"""Attention batches in beam search's shape for the kernel tests: sequences that share
leading blocks (forks of a prompt, beams diverging at different blocks), sliding windows,
soft-capping, mixed prefill and decode, in a shuffled paged pool of random K/V."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tts_runtime.executor.batch import AttentionMetadata


@dataclass
class Seq:
    context_len: int
    query_len: int = 1  # 1 and listed with decodes=True: a decode; otherwise a prefill chunk
    decode: bool = True
    share: tuple[int, int] | None = None  # (earlier sequence, leading blocks taken from its table)


@dataclass
class Case:
    seqs: list[Seq]
    dtype: torch.dtype = torch.float32
    block_size: int = 16
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    window: int | None = None
    softcap: float | None = None
    strided: bool = False  # caches as block-major views (the elastic pool's layout)
    seed: int = 0
    tables: list[list[int]] = field(default_factory=list)


def build(case: Case):
    gen = torch.Generator().manual_seed(case.seed)
    bs = case.block_size
    next_id = iter(torch.randperm(4096, generator=gen).tolist())
    tables: list[list[int]] = []
    for seq in case.seqs:
        own = list(tables[seq.share[0]][: seq.share[1]]) if seq.share else []
        own += [next(next_id) for _ in range(-(-seq.context_len // bs) - len(own))]
        tables.append(own)
    case.tables = tables
    num_blocks = 4096
    hkv, d = case.num_kv_heads, case.head_dim
    if case.strided:
        pool = torch.randn(num_blocks, 5, bs, hkv, d, generator=gen).to(case.dtype)
        k_cache, v_cache = pool[:, 1], pool[:, 3]
    else:
        k_cache = torch.randn(num_blocks, bs, hkv, d, generator=gen).to(case.dtype)
        v_cache = torch.randn(num_blocks, bs, hkv, d, generator=gen).to(case.dtype)
    decodes = [i for i, s in enumerate(case.seqs) if s.decode]
    prefills = [i for i, s in enumerate(case.seqs) if not s.decode]
    width = max(len(t) for t in tables) + 1

    def padded(rows: list[int]) -> torch.Tensor:
        return torch.tensor([tables[i] + [0] * (width - len(tables[i])) for i in rows] or [[0] * width],
                            dtype=torch.int32)

    starts, start = [], len(decodes)
    for i in prefills:
        starts.append(start)
        start += case.seqs[i].query_len
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(0, dtype=torch.long),
        num_decodes=len(decodes),
        decode_block_tables=padded(decodes),
        decode_context_lens=torch.tensor([case.seqs[i].context_len for i in decodes], dtype=torch.int32),
        prefill_query_starts=starts,
        prefill_query_lens=[case.seqs[i].query_len for i in prefills],
        prefill_context_lens=[case.seqs[i].context_len for i in prefills],
        prefill_block_tables=padded(prefills),
        block_size=bs,
    )
    h = case.num_heads
    qkv = torch.randn(start, h + 2 * hkv, d, generator=gen).to(case.dtype)
    return qkv[:, :h], k_cache, v_cache, meta


def forks(n: int, prompt: int, suffixes: list[int], bs: int = 16) -> list[Seq]:
    """`n` forks of one prompt of `prompt` tokens; fork i has generated suffixes[i] tokens."""
    first = Seq(prompt + suffixes[0])
    return [first] + [Seq(prompt + s, share=(0, prompt // bs)) for s in suffixes[1:n]]


BEAMS = forks(4, 300, [40, 7, 70, 1])
CASES = {
    "forks-of-one-prompt": Case(BEAMS),
    "beams-diverging-at-different-blocks": Case([
        Seq(500), Seq(470, share=(0, 29)), Seq(420, share=(0, 10)), Seq(333, share=(2, 20)),
        Seq(90, share=(0, 2))]),
    "sequence-sharing-nothing": Case(BEAMS + [Seq(1200), Seq(17)]),
    "sliding-window-gqa4-bs8": Case(forks(3, 250, [30, 3, 61]) + [Seq(40)], num_heads=4, num_kv_heads=1,
                                    head_dim=128, block_size=8, window=64),
    "softcap-window": Case(BEAMS, softcap=3.0, window=100),
    "mixed-prefill-and-decode": Case(BEAMS + [
        Seq(380, 60, decode=False, share=(0, 18)), Seq(330, 45, decode=False, share=(0, 18)),
        Seq(70, 70, decode=False)]),
    "long-single-sequence": Case([Seq(2500)]),
    "block-major-strided-pool": Case(BEAMS + [Seq(200, 33, decode=False, share=(1, 5))], strided=True),
    "bf16": Case(BEAMS + [Seq(350, 40, decode=False, share=(0, 18))], dtype=torch.bfloat16),
    "bf16-gemma-shape": Case(forks(4, 300, [20, 9, 33, 5]), dtype=torch.bfloat16, num_heads=4,
                             num_kv_heads=1, head_dim=256, window=128, softcap=20.0),
    # head_dim not a multiple of 32: the bf16 dot products' paired value sum does not apply.
    "bf16-head-dim-80": Case(forks(3, 200, [12, 40, 3]), dtype=torch.bfloat16, num_heads=4, num_kv_heads=2,
                             head_dim=80),
}
