"""A forward's attention work as *items* over the paged cache, shared by the CPU kernel
(cpu_attention.py) and the Triton cascade kernel (triton_attention.py).

An item is a run of keys read through one block table, and the query rows that attend to
it. With cascade on, sequences whose block tables start with the same block ids form a
tree; each tree node is one item whose keys are read once for the queries of every
sequence below it, and a token's partial softmaxes from the nodes on its path are merged
by log-sum-exp. The same plan serves decodes and prefill chunks over a cached prefix.
Groups come from the block ids alone, never from the search layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tts_runtime.executor.batch import AttentionMetadata

# Query rows per item: enough rows to reuse each converted key block many times, few enough
# that a long prefill chunk still splits into items for every core.
ROW_TILE = 32
# Keys per item: splits one long context over the cores when the batch is a single sequence.
KEY_SPLIT = 1024

@dataclass(frozen=True)
class AttentionPlan:
    """One forward's work for the kernel (see the C++ file for the layouts)."""

    tables: torch.Tensor  # [sequences, width] int32 block tables
    items: torch.Tensor  # [items, 5] int32: sequence, key_lo, key_hi, row_begin, row_end
    rows: torch.Tensor  # [entries, 2] int32: flat token, position
    parts_ptr: torch.Tensor  # [tokens + 1] int32: each token's entries in `parts`
    parts: torch.Tensor  # [entries] int32


@dataclass(frozen=True)
class _Seq:
    first_row: int  # its first query row in the flat batch
    num_queries: int
    context_len: int
    table: list[int]


def batch_sequences(meta: AttentionMetadata) -> list[_Seq]:
    seqs = []
    lens = meta.decode_context_lens.tolist()
    for i, table in enumerate(meta.decode_block_tables.tolist()[: meta.num_decodes]):
        seqs.append(_Seq(i, 1, lens[i], table))
    prefill_tables = meta.prefill_block_tables.tolist()
    for i, qlen in enumerate(meta.prefill_query_lens):
        seqs.append(_Seq(meta.prefill_query_starts[i], qlen, meta.prefill_context_lens[i], prefill_tables[i]))
    return seqs


def shares_blocks(meta: AttentionMetadata) -> bool:
    """Whether any two sequences of the batch start with the same block (cascade has work)."""
    firsts = [seq.table[0] for seq in batch_sequences(meta) if seq.context_len > 0]
    return len(set(firsts)) < len(firsts)


def _num_blocks(seq: _Seq, block_size: int) -> int:
    return -(-seq.context_len // block_size)


def prefix_tree(seqs: list[_Seq], block_size: int) -> list[tuple[list[int], int, int]]:
    """Nodes (members, first block, end block): the members share block ids [first, end) and
    every block before `first`; each sequence's blocks are covered by exactly one path."""
    nodes: list[tuple[list[int], int, int]] = []
    stack = [(list(range(len(seqs))), 0)]
    while stack:
        members, depth = stack.pop()
        if len(members) == 1:
            nodes.append((members, depth, _num_blocks(seqs[members[0]], block_size)))
            continue
        end = depth
        while all(_num_blocks(seqs[s], block_size) > end for s in members) and \
                len({seqs[s].table[end] for s in members}) == 1:
            end += 1
        if end > depth:
            nodes.append((members, depth, end))
        branches: dict[int, list[int]] = {}
        for s in members:
            if _num_blocks(seqs[s], block_size) > end:
                branches.setdefault(seqs[s].table[end], []).append(s)
        stack.extend((branch, end) for branch in branches.values())
    return nodes


def build_plan(meta: AttentionMetadata, num_tokens: int, cascade: bool) -> AttentionPlan:
    seqs = batch_sequences(meta)
    bs = meta.block_size
    if cascade:
        nodes = prefix_tree(seqs, bs)
    else:
        nodes = [([s], 0, _num_blocks(seq, bs)) for s, seq in enumerate(seqs)]
    work: list[tuple[int, int, int, list[tuple[int, int]]]] = []  # (sequence, key_lo, key_hi, rows)
    for members, first, end in nodes:
        key_lo = first * bs
        key_hi = min(end * bs, max(seqs[s].context_len for s in members))
        rows = [(seqs[s].first_row + i, seqs[s].context_len - seqs[s].num_queries + i)
                for s in members for i in range(seqs[s].num_queries)]
        for r0 in range(0, len(rows), ROW_TILE):
            tile = rows[r0: r0 + ROW_TILE]
            last_pos = max(pos for _, pos in tile)
            for k0 in range(key_lo, min(key_hi, last_pos + 1), KEY_SPLIT):
                work.append((members[0], k0, min(k0 + KEY_SPLIT, key_hi), tile))
    # Largest first: the kernel hands items to threads dynamically, so the tail is short.
    work.sort(key=lambda w: (w[2] - w[1]) * len(w[3]), reverse=True)
    items, rows_flat, start = [], [], 0
    for seq, k0, k1, tile in work:
        items.append((seq, k0, k1, start, start + len(tile)))
        rows_flat.extend(tile)
        start += len(tile)
    rows_t = torch.tensor(rows_flat, dtype=torch.int32).view(-1, 2)
    order = torch.argsort(rows_t[:, 0], stable=True)
    counts = torch.bincount(rows_t[:, 0].long(), minlength=num_tokens)
    parts_ptr = torch.zeros(num_tokens + 1, dtype=torch.int32)
    parts_ptr[1:] = torch.cumsum(counts, 0)
    width = max(len(s.table) for s in seqs)
    tables = torch.tensor([s.table + [0] * (width - len(s.table)) for s in seqs], dtype=torch.int32)
    return AttentionPlan(tables, torch.tensor(items, dtype=torch.int32).view(-1, 5), rows_t,
                         parts_ptr, order.to(torch.int32))
