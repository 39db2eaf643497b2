"""Turns a scheduled batch into flat model inputs (token ids, positions, KV slots,
attention metadata) and remembers which output row belongs to which sequence."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tts_runtime.engine.scheduler import ScheduledBatch
from tts_runtime.engine.sequence import Sequence
from tts_runtime.executor.batch import PLACEHOLDER_TOKEN, AttentionMetadata, ModelInput
from tts_runtime.executor.host_copy import values_on_device


@dataclass
class BatchLayout:
    """Where each sequence's results land in the model output."""

    sample_seqs: list[Sequence] = field(default_factory=list)
    # Per score group: list of (sequence, requested position) in row order.
    score_targets: list[list[tuple[Sequence, int]]] = field(default_factory=list)
    chunks: list[tuple[Sequence, int]] = field(default_factory=list)  # every (sequence, tokens computed)


def _padded_tables(seqs: list[Sequence]) -> np.ndarray:
    """The sequences' block tables as rows of one zero-padded int32 array, from each one's
    int32 mirror (table_mirror.py): converting the Python lists whole each step cost up to
    270 us at 64 sequences."""
    tables = [seq.table_mirror.of(seq.block_table) for seq in seqs]
    padded = np.zeros((len(tables), max(map(len, tables), default=1) or 1), dtype=np.int32)
    for row, table in enumerate(tables):
        padded[row, :len(table)] = table
    return padded


def _slots(tables: np.ndarray, rows: np.ndarray, positions: np.ndarray, block_size: int) -> np.ndarray:
    """The KV slot of each (table row, position)."""
    return tables[rows, positions // block_size].astype(np.int64) * block_size + positions % block_size


def _tables_on_device(tables: np.ndarray, device: torch.device) -> torch.Tensor:
    # No sequences: a 1-d empty tensor, as the attention backends expect.
    return values_on_device(tables if len(tables) else np.empty(0, dtype=np.int32), torch.int32, device)


@dataclass(slots=True)
class _PrefillChunks:
    """The prefill chunks of one batch, in the order their tokens sit in the flat input."""

    starts: list[int]  # first row of each chunk in the input
    firsts: list[int]  # first position of each chunk in its sequence
    query_lens: list[int]
    context_lens: list[int]
    seqs: list[Sequence]
    # Score rows grouped by candidate token ids: input rows, and (sequence, position) per row.
    score_groups: dict[tuple[int, ...], tuple[list[int], list[tuple[Sequence, int]]]]


def _add_decodes(decodes: list[Sequence], ids: list[int], sample_rows: list[int],
                 layout: BatchLayout) -> np.ndarray:
    """Appends one input token per decode; returns each decode's position."""
    positions = []
    for seq in decodes:
        # A decode going ahead (async scheduling) is one token past its microbatch in flight,
        # whose sampled token, its input, the executor fills in.
        pos = seq.num_computed_tokens + seq.in_flight
        positions.append(pos)
        ids.append(seq.token_ids[pos] if pos < seq.num_tokens else PLACEHOLDER_TOKEN)
        sample_rows.append(len(ids) - 1)
        layout.sample_seqs.append(seq)
        layout.chunks.append((seq, 1))
    return np.fromiter(positions, dtype=np.int64, count=len(positions))


def _add_prefills(prefills: list[tuple[Sequence, int]], ids: list[int], sample_rows: list[int],
                  layout: BatchLayout) -> _PrefillChunks:
    """Appends each chunk's tokens; a chunk that ends its prompt is sampled, and a score
    request's positions inside the chunk become score rows."""
    starts, firsts, query_lens, context_lens, seqs = [], [], [], [], []
    score_groups: dict[tuple[int, ...], tuple[list[int], list[tuple[Sequence, int]]]] = {}
    for seq, n in prefills:
        start, first = len(ids), seq.num_computed_tokens
        end = first + n
        ids.extend(seq.token_ids[first:end])
        starts.append(start)
        firsts.append(first)
        query_lens.append(n)
        context_lens.append(end)
        seqs.append(seq)
        layout.chunks.append((seq, n))
        if seq.is_score:
            params = seq.group.params
            rows, targets = score_groups.setdefault(params.candidate_token_ids, ([], []))
            for p in params.positions:
                if first <= p < end:
                    rows.append(start + p - first)
                    targets.append((seq, p))
        elif end == seq.num_tokens:
            sample_rows.append(len(ids) - 1)
            layout.sample_seqs.append(seq)
    return _PrefillChunks(starts, firsts, query_lens, context_lens, seqs, score_groups)


def _prefill_positions(chunks: _PrefillChunks) -> tuple[np.ndarray, np.ndarray]:
    """Each prefill token's chunk index and position in its sequence, as whole arrays."""
    lens = np.fromiter(chunks.query_lens, dtype=np.int64, count=len(chunks.query_lens))
    chunk_of_token = np.repeat(np.arange(len(lens)), lens)
    offsets = np.asarray(chunks.firsts, dtype=np.int64) - np.cumsum(lens) + lens
    return chunk_of_token, np.arange(len(chunk_of_token)) + np.repeat(offsets, lens)


def _score_rows(score_groups: dict[tuple[int, ...], tuple[list[int], list[tuple[Sequence, int]]]],
                layout: BatchLayout, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per candidate-token group with rows in this batch: (rows, candidate ids) on the device."""
    score_rows = []
    for candidates, (rows, targets) in score_groups.items():
        if rows:
            score_rows.append((values_on_device(rows, torch.long, device),
                               values_on_device(candidates, torch.long, device)))
            layout.score_targets.append(targets)
    return score_rows


def build_model_input(batch: ScheduledBatch, block_size: int,
                      device: torch.device) -> tuple[ModelInput, BatchLayout]:
    """Positions and KV slots are computed as whole arrays, not per token: a PRM batch
    carries thousands of tokens in a hundred chunks (per-chunk arrays, and `torch.tensor`
    on Python lists, cost ~1 ms of host time a PRM step, with the device often idle)."""
    ids: list[int] = []
    sample_rows: list[int] = []
    layout = BatchLayout()
    decode_at = _add_decodes(batch.decodes, ids, sample_rows, layout)
    prefills = _add_prefills(batch.prefills, ids, sample_rows, layout)
    chunk_of_token, prefill_at = _prefill_positions(prefills)
    decode_tables, prefill_tables = _padded_tables(batch.decodes), _padded_tables(prefills.seqs)
    slots = np.concatenate([_slots(decode_tables, np.arange(len(decode_at)), decode_at, block_size),
                            _slots(prefill_tables, chunk_of_token, prefill_at, block_size)])
    # Every tensor is queued onto the device (host_copy.py): a forward still running there
    # (async scheduling) must not hold up building the next one.
    meta = AttentionMetadata(
        slot_mapping=values_on_device(slots, torch.long, device),
        num_decodes=len(batch.decodes),
        decode_block_tables=_tables_on_device(decode_tables, device),
        decode_context_lens=values_on_device(decode_at + 1, torch.int32, device),
        prefill_query_starts=prefills.starts,
        prefill_query_lens=prefills.query_lens,
        prefill_context_lens=prefills.context_lens,
        prefill_block_tables=_tables_on_device(prefill_tables, device),
        block_size=block_size,
    )
    score_rows = _score_rows(prefills.score_groups, layout, device)
    model_input = ModelInput(
        input_ids=values_on_device(ids, torch.long, device),
        positions=values_on_device(np.concatenate([decode_at, prefill_at]), torch.long, device),
        meta=meta,
        sample_rows=values_on_device(sample_rows, torch.long, device),
        score_rows=score_rows,
        read_rows=sorted(set(sample_rows).union(*(rows for rows, _ in prefills.score_groups.values()))),
        block_copies=(values_on_device(np.array(batch.block_copies, dtype=np.int64).T.copy(), torch.long, device)
                      if batch.block_copies else None),
    )
    return model_input, layout
