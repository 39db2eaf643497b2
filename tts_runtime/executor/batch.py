"""The messages between the driver and the device side: one scheduled forward's inputs
(`ModelInput`, with its `AttentionMetadata`) and its outputs (`ModelOutput`).

A leaf module: every executor, attention backend and CUDA-graph runner reads these types,
and the driver builds them, so none of those modules has to import another for them.

KV layout, per layer: ``k_cache``/``v_cache`` of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``. A token's KV lives at flat slot
``block_id * block_size + offset``. A forward batch is flat (varlen): the decode tokens of
``num_decodes`` sequences come first (one token each), then the prefill chunks, one
contiguous run per sequence. A prefill chunk may extend a prefix whose KV is already
cached, so its queries sit at positions ``context_len - query_len ... context_len - 1``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from tts_runtime.executor.sampler import SamplingRow


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64: where each new token's K/V is stored
    num_decodes: int
    decode_block_tables: torch.Tensor  # [num_decodes, max_blocks] int32
    decode_context_lens: torch.Tensor  # [num_decodes] int32, includes the new token
    prefill_query_starts: list[int]  # offset of each chunk in the flat batch
    prefill_query_lens: list[int]
    prefill_context_lens: list[int]  # cached prefix + this chunk
    prefill_block_tables: torch.Tensor  # [num_prefills, max_blocks] int32
    block_size: int
    # Set only by a score CUDA graph's static buffers, whose chunks change from replay to replay:
    # the prefill lists are then empty and this device tile table (prefill_tiles.py) is the chunks.
    prefill_tiles: torch.Tensor | None = None

    @property
    def num_prefills(self) -> int:
        return len(self.prefill_query_lens)

    @cached_property
    def decode_length_groups(self) -> list[DecodeGroup]:
        """The decodes split into runs of similar context length, for backends that pad a
        decode batch to its longest context. Computed once per batch, shared by all layers."""
        return group_by_length(self.decode_context_lens, self.decode_block_tables, self.block_size)


@dataclass(frozen=True)
class DecodeGroup:
    rows: torch.Tensor  # [n] int64: the group's rows among the decodes
    block_tables: torch.Tensor  # [n, blocks covering max_len]
    context_lens: torch.Tensor  # [n]
    max_len: int


# A group grows while its padded size stays within this factor of its real tokens: past
# ~1.1 the padding costs more than another group's per-layer launch overhead.
_GROUP_PADDING = 1.1


def group_by_length(context_lens: torch.Tensor, block_tables: torch.Tensor, block_size: int) -> list[DecodeGroup]:
    order = torch.argsort(context_lens, descending=True, stable=True)
    lengths = context_lens[order].tolist()
    groups, start = [], 0
    while start < len(lengths):
        longest, end, total = lengths[start], start + 1, lengths[start]
        while end < len(lengths) and longest * (end + 1 - start) <= _GROUP_PADDING * (total + lengths[end]):
            total += lengths[end]
            end += 1
        rows = order[start:end]
        groups.append(DecodeGroup(rows, block_tables[rows, : -(-longest // block_size)], context_lens[rows],
                                  longest))
        start = end
    return groups


def whole_decode_batch(meta: AttentionMetadata) -> DecodeGroup:
    longest = int(meta.decode_context_lens.max())
    rows = torch.arange(meta.num_decodes, device=meta.decode_context_lens.device)
    return DecodeGroup(rows, meta.decode_block_tables[:, : -(-longest // meta.block_size)],
                       meta.decode_context_lens, longest)


@dataclass
class ModelInput:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # rows of the flat batch whose full-vocabulary logits are sampled
    # Score rows grouped by candidate set: (rows, candidate token ids).
    score_rows: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)
    # The rows of sample_rows and score_rows, sorted, on the host: set by the engine's batch
    # builder, so that finding them needs no read-back from the device.
    read_rows: list[int] | None = None
    # [2, k] int64 (source row, destination row): whole KV blocks to copy in every layer
    # before the forward (a forked child's copy of its parent's partial block); None: none.
    block_copies: torch.Tensor | None = None


# The input id of a decode scheduled while the microbatch sampling its token still runs
# (async scheduling): the executor replaces it, and the last token of its sampling row.
PLACEHOLDER_TOKEN = -1


@dataclass
class SamplePlan:
    """What to sample from a batch's logits: row `logit_rows[i]` of the sampled logits with
    `rows[i]` (a forking prompt's children sample the parent's row once each).

    `filled_from`: (row, previous row) pairs, async scheduling: the token sampled for row
    `previous row` of the previous microbatch's plan is this row's input (a decode's plan
    row is its input row) and `rows[row].filled_token`, which the executor sets."""

    logit_rows: list[int]
    rows: list[SamplingRow]
    filled_from: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class ModelOutput:
    sample_logits: torch.Tensor  # [len(sample_rows), vocab]; empty when the executor sampled
    score_logits: list[torch.Tensor]  # per score group: [rows, candidates]
    sampled_tokens: list[int] | None = None  # one per SamplePlan row, when the executor sampled


