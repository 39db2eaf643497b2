"""build_model_input on a hand-built batch: every tensor against values worked out by hand."""

from __future__ import annotations

import torch

from tts_runtime.engine.batch_builder import build_model_input
from tts_runtime.engine.request import SamplingParams, ScoreParams
from tts_runtime.engine.scheduler import ScheduledBatch
from tts_runtime.engine.sequence import RequestGroup, Sequence
from tts_runtime.executor.pipeline import wire
from tts_runtime.executor.pipeline.stage_messages import Launch

BLOCK = 4
CPU = torch.device("cpu")


def sequence(seq_id: int, num_tokens: int, table: list[int], computed: int,
             params: SamplingParams | ScoreParams | None = None) -> Sequence:
    tokens = [100 * seq_id + i for i in range(num_tokens)]
    group = RequestGroup(f"r{seq_id}", tokens, params or SamplingParams(temperature=0, max_tokens=8))
    seq = Sequence(seq_id, group, list(tokens))
    seq.block_table, seq.num_computed_tokens = table, computed
    group.sequences.append(seq)
    return seq


def test_decodes_and_prefill_chunks_land_in_their_slots_and_rows():
    # Decodes: a 6-token sequence computing position 5 (block 7, offset 1) and a 9-token one
    # computing position 8 (its third block, 2, offset 0).
    short = sequence(1, 6, [3, 7], computed=5)
    long = sequence(2, 9, [5, 6, 2], computed=8)
    # A prefill chunk past a cached prefix that ends mid-block: positions 6..10 of 12, in
    # blocks 9 (offsets 2, 3) and 4 (offsets 0..2); the chunk does not finish the prompt.
    chunk = sequence(3, 12, [1, 9, 4], computed=6)
    # A whole score prompt of 5 tokens in blocks 8, 0, scored at positions 2 and 4.
    score = sequence(4, 5, [8, 0], computed=0, params=ScoreParams(positions=(2, 4), candidate_token_ids=(11, 12)))
    batch = ScheduledBatch(decodes=[short, long], prefills=[(chunk, 5), (score, 5)])

    model_input, layout = build_model_input(batch, BLOCK, CPU)

    meta = model_input.meta
    assert model_input.input_ids.tolist() == [105, 208, 306, 307, 308, 309, 310, 400, 401, 402, 403, 404]
    assert model_input.positions.tolist() == [5, 8, 6, 7, 8, 9, 10, 0, 1, 2, 3, 4]
    assert meta.slot_mapping.tolist() == [29, 8, 38, 39, 16, 17, 18, 32, 33, 34, 35, 0]
    assert meta.slot_mapping.dtype == torch.long
    assert meta.decode_block_tables.tolist() == [[3, 7, 0], [5, 6, 2]]
    assert meta.decode_block_tables.dtype == torch.int32
    assert meta.decode_context_lens.tolist() == [6, 9]
    assert meta.prefill_block_tables.tolist() == [[1, 9, 4], [8, 0, 0]]
    assert (meta.prefill_query_starts, meta.prefill_query_lens, meta.prefill_context_lens) == ([2, 7], [5, 5], [11, 5])
    assert model_input.sample_rows.tolist() == [0, 1]  # the unfinished chunk samples nothing
    [(rows, candidates)] = model_input.score_rows
    assert rows.tolist() == [9, 11] and candidates.tolist() == [11, 12]
    assert layout.sample_seqs == [short, long]
    assert layout.score_targets == [[(score, 2), (score, 4)]]


def test_a_batch_without_decodes_keeps_an_empty_decode_table():
    prompt = sequence(1, 3, [2], computed=0)
    model_input, _ = build_model_input(ScheduledBatch(prefills=[(prompt, 3)]), BLOCK, CPU)
    assert model_input.meta.decode_block_tables.shape == (0,)
    assert model_input.meta.slot_mapping.tolist() == [8, 9, 10]
    assert model_input.sample_rows.tolist() == [2]


def test_a_decode_only_batch_crosses_the_pipeline_wire():
    """Its empty prefill tensors come from numpy, whose empty results can have 0 strides:
    the wire's byte view refuses those."""
    decode = sequence(1, 6, [3, 7], computed=5)
    model_input, _ = build_model_input(ScheduledBatch(decodes=[decode]), BLOCK, CPU)
    sent = wire.decode(wire.encode(Launch(0, "generator", model_input, None))).batch
    assert sent.positions.tolist() == [5] and sent.meta.slot_mapping.tolist() == [29]
    assert sent.meta.prefill_block_tables.shape == (0,) and sent.meta.decode_block_tables.tolist() == [[3, 7]]


def test_tables_follow_their_lists_from_step_to_step():
    """The int32 mirror behind the padded tables copies only what a table grew by: a table
    extended in place, one replaced by a new list (a preemption, a prefix hit) and one
    replaced by a shorter list all read as their lists each step."""
    grows = sequence(1, 6, [3, 7], computed=5)
    replaced = sequence(2, 9, [5, 6, 2], computed=8)
    assert _decode_tables([grows, replaced]) == [[3, 7, 0], [5, 6, 2]]
    grows.block_table.extend([11] * 30)  # past the mirror's first capacity
    grows.token_ids += [0] * 120
    grows.num_computed_tokens = len(grows.token_ids) - 1
    replaced.block_table = [9, 8, 1]
    assert _decode_tables([grows, replaced]) == [[3, 7] + [11] * 30, [9, 8, 1] + [0] * 29]
    replaced.block_table = [4]
    replaced.token_ids, replaced.num_computed_tokens = replaced.token_ids[:3], 2
    assert _decode_tables([replaced, grows])[0] == [4] + [0] * 31


def _decode_tables(decodes: list[Sequence]) -> list[list[int]]:
    return build_model_input(ScheduledBatch(decodes=decodes), BLOCK, CPU)[0].meta.decode_block_tables.tolist()
