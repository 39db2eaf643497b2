"""CPU paged attention that reads K/V in place in the block pool (csrc/paged_attention_cpu.cpp),
with shared-prefix (cascade) attention.

The torch backend copies every sequence's whole context out of the pool for every layer at
every step; on beam search's shape (few sequences, contexts of a few thousand tokens that the
beams of a problem share) that copy and the attention over it were half of a CPU run. This
backend plans each forward once (shared by all layers) as *items*: a run of keys read through
one block table, and the query rows that attend to it. With cascade on, sequences whose block
tables start with the same block ids form a tree; each tree node is one item whose keys are
read once for the queries of every sequence below it, and a token's partial softmaxes from
the nodes on its path are merged by log-sum-exp. The same plan serves decodes and prefill
chunks over a cached prefix (the PRM's score requests), so neither copies the cached context.

The kernel is compiled on first use (`make setup` does it once) with torch's extension
tooling and cached under the tts cache folder; when it cannot be built, `select_backend`
falls back to the torch backend and says so once.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from tts_runtime.executor.attention import AttentionBackend, store_kv
from tts_runtime.executor.batch import AttentionMetadata
from tts_runtime.models.loader import cache_root


_SOURCE = Path(__file__).parent / "csrc" / "paged_attention_cpu.cpp"

# Query rows per item: enough rows to reuse each converted key block many times, few enough
# that a long prefill chunk still splits into items for every core.
ROW_TILE = 32
# Keys per item: splits one long context over the cores when the batch is a single sequence.
KEY_SPLIT = 1024
# The kernel's vector width in fp32 lanes: head_dim must be a multiple of it.
HEAD_DIM_MULTIPLE = 16


class KernelUnavailable(RuntimeError):
    """The C++ kernel could not be built or loaded on this machine."""


def build_dir() -> Path:
    """One folder per torch version (the extension links against torch's C++ ABI) and per
    source file and contents: ninja rebuilds whenever the source path in its build file
    changes, so two checkouts sharing one folder would rebuild each other's kernel."""
    digest = hashlib.sha1(str(_SOURCE).encode() + _SOURCE.read_bytes()).hexdigest()[:12]
    return cache_root() / "torch_extensions" / f"torch-{torch.__version__.replace('+', '-')}-{digest}"


@functools.cache
def load_kernel() -> ModuleType:
    """Builds (first call on a machine, ~1 min) or loads the cached extension."""
    try:
        from torch.utils.cpp_extension import load

        folder = build_dir()
        folder.mkdir(parents=True, exist_ok=True)
        # The `ninja` dependency installs next to this interpreter, which need not be on PATH
        # (.venv/bin/tts run without activating the venv).
        scripts = str(Path(sys.executable).parent)
        if scripts not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
        # -march=native: the build runs on the machine that uses it (make setup or first use).
        return load(name="tts_paged_attention_cpu", sources=[str(_SOURCE)], build_directory=str(folder),
                    extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
                    verbose=False)
    except Exception as exc:  # any build or load failure means: use the torch path
        raise KernelUnavailable(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from exc


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


class CpuPagedAttention:
    """The C++ paged-attention kernel; `cascade` turns shared-prefix attention on. Head sizes
    the kernel does not take (not a multiple of 16) go to `fallback`."""

    name = "cpu"

    def __init__(self, kernel: ModuleType, cascade: bool = True, fallback: AttentionBackend | None = None) -> None:
        self.kernel = kernel
        self.cascade = cascade
        self.fallback = fallback
        # Every layer of a forward passes the same metadata: plan once per forward.
        self._plan_for: tuple[AttentionMetadata, AttentionPlan] | None = None

    def store_kv(self, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                 v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        store_kv(key, value, k_cache, v_cache, slot_mapping)

    def plan(self, meta: AttentionMetadata, num_tokens: int) -> AttentionPlan:
        if self._plan_for is None or self._plan_for[0] is not meta:
            self._plan_for = (meta, build_plan(meta, num_tokens, self.cascade))
        return self._plan_for[1]

    def attend(self, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float, sliding_window: int | None,
               softcap: float | None) -> torch.Tensor:
        if query.shape[2] % HEAD_DIM_MULTIPLE and self.fallback is not None:
            return self.fallback.attend(query, k_cache, v_cache, meta, scale, sliding_window, softcap)
        if query.stride(2) != 1 or query.stride(1) != query.shape[2]:
            query = query.contiguous()
        out = torch.empty(query.shape, dtype=query.dtype)
        if query.shape[0] == 0:
            return out
        p = self.plan(meta, query.shape[0])
        self.kernel.paged_attention(query, k_cache, v_cache, p.tables, p.items, p.rows, p.parts_ptr, p.parts,
                                    out, float(scale), float(softcap or 0.0), int(sliding_window or 0))
        return out
