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


def build_model_input(batch: ScheduledBatch, block_size: int,
                      device: torch.device) -> tuple[ModelInput, BatchLayout]:
    """Positions and KV slots are computed as whole arrays, not per token: a PRM batch
    carries thousands of tokens in a hundred chunks (per-chunk arrays, and `torch.tensor`
    on Python lists, cost ~1 ms of host time a PRM step, with the device often idle)."""
    ids: list[int] = []
    layout = BatchLayout()
    sample_rows: list[int] = []
    score_groups: dict[tuple[int, ...], tuple[list[int], list[tuple[Sequence, int]]]] = {}

    decode_positions = []
    for seq in batch.decodes:
        # A decode going ahead (async scheduling) is one token past its microbatch in flight,
        # whose sampled token, its input, the executor fills in.
        pos = seq.num_computed_tokens + seq.in_flight
        decode_positions.append(pos)
        ids.append(seq.token_ids[pos] if pos < seq.num_tokens else PLACEHOLDER_TOKEN)
        sample_rows.append(len(ids) - 1)
        layout.sample_seqs.append(seq)
        layout.chunks.append((seq, 1))

    starts, firsts, query_lens, context_lens, prefill_seqs = [], [], [], [], []
    for seq, n in batch.prefills:
        start, first = len(ids), seq.num_computed_tokens
        end = first + n
        ids.extend(seq.token_ids[first:end])
        starts.append(start)
        firsts.append(first)
        query_lens.append(n)
        context_lens.append(end)
        prefill_seqs.append(seq)
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

    decode_tables, prefill_tables = _padded_tables(batch.decodes), _padded_tables(prefill_seqs)
    decode_at = np.fromiter(decode_positions, dtype=np.int64, count=len(decode_positions))
    lens = np.fromiter(query_lens, dtype=np.int64, count=len(query_lens))
    chunk_of_token = np.repeat(np.arange(len(lens)), lens)
    prefill_at = np.arange(len(chunk_of_token)) + np.repeat(np.asarray(firsts, dtype=np.int64) - np.cumsum(lens) + lens,
                                                             lens)
    positions = np.concatenate([decode_at, prefill_at])
    slots = np.concatenate([_slots(decode_tables, np.arange(len(decode_at)), decode_at, block_size),
                            _slots(prefill_tables, chunk_of_token, prefill_at, block_size)])
    # Every tensor is queued onto the device (host_copy.py): a forward still running there
    # (async scheduling) must not hold up building the next one.
    meta = AttentionMetadata(
        slot_mapping=values_on_device(slots, torch.long, device),
        num_decodes=len(batch.decodes),
        decode_block_tables=_tables_on_device(decode_tables, device),
        decode_context_lens=values_on_device(decode_at + 1, torch.int32, device),
        prefill_query_starts=starts,
        prefill_query_lens=query_lens,
        prefill_context_lens=context_lens,
        prefill_block_tables=_tables_on_device(prefill_tables, device),
        block_size=block_size,
    )
    score_rows = []
    read_rows = set(sample_rows)
    for candidates, (rows, targets) in score_groups.items():
        if rows:
            score_rows.append((values_on_device(rows, torch.long, device),
                               values_on_device(candidates, torch.long, device)))
            layout.score_targets.append(targets)
            read_rows.update(rows)
    model_input = ModelInput(
        input_ids=values_on_device(ids, torch.long, device),
        positions=values_on_device(positions, torch.long, device),
        meta=meta,
        sample_rows=values_on_device(sample_rows, torch.long, device),
        score_rows=score_rows,
        read_rows=sorted(read_rows),
        block_copies=(values_on_device(np.array(batch.block_copies, dtype=np.int64).T.copy(), torch.long, device)
                      if batch.block_copies else None),
    )
    return model_input, layout
