"""Measured time of each decoder layer and of the output head, for the pipeline's split.

A pipeline's bubbles come from unequal stage times, and a count of multiply-adds misjudges
them: attention over the cache, the elementwise ops and the head's wide matmul run at
different speeds than the projections. So before the stages start, the driver times one
decode step layer by layer, with the layer ops, attention backend and thread count the
stages will use: a few sequences decoding over one shared cached context (the beams of a
problem), whose every row is sampled (full vocabulary) or scored (a few candidate columns).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from tts_runtime.config import EngineConfig
from tts_runtime.executor.attention.backends import backend_for
from tts_runtime.executor.batch import AttentionMetadata, ModelInput
from tts_runtime.executor.kv_cache import allocate_kv_cache
from tts_runtime.executor.layer_ops import layer_ops
from tts_runtime.executor.local import compute_output_logits
from tts_runtime.models.loader import LoadedModel

PROBE_ROWS = 16
PROBE_CONTEXT = 256
_REPEATS = 5
_SCORE_CANDIDATES = 2  # a PRM scores a handful of candidate ids ("+"/"-", yes/no)


@dataclass(frozen=True)
class StageCosts:
    layers: list[float]  # median seconds of each decoder layer on the probe step
    head: float  # median seconds of the output head on the probe step's rows


def _probe_batch(loaded: LoadedModel, config: EngineConfig, samples_full_vocabulary: bool) -> ModelInput:
    device = loaded.model.output_weight.device
    rows = min(PROBE_ROWS, config.scheduler.max_num_seqs)
    context = min(PROBE_CONTEXT, loaded.arch.max_position_embeddings - 1)
    blocks = -(-context // config.cache.block_size)
    every_row = torch.arange(rows, device=device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    return ModelInput(
        input_ids=torch.randint(0, loaded.arch.vocab_size, (rows,), generator=generator).to(device),
        positions=torch.full((rows,), context - 1, device=device),
        meta=AttentionMetadata(
            slot_mapping=torch.full((rows,), context - 1, device=device),
            num_decodes=rows,
            decode_block_tables=torch.arange(blocks, dtype=torch.int32, device=device).repeat(rows, 1),
            decode_context_lens=torch.full((rows,), context, dtype=torch.int32, device=device),
            prefill_query_starts=[], prefill_query_lens=[], prefill_context_lens=[],
            prefill_block_tables=torch.zeros((0, 1), dtype=torch.int32, device=device),
            block_size=config.cache.block_size,
        ),
        sample_rows=every_row if samples_full_vocabulary else every_row[:0],
        score_rows=[] if samples_full_vocabulary else [
            (every_row, torch.arange(_SCORE_CANDIDATES, device=device))],
    )


def _timed(run: Callable[[], object], device: torch.device) -> tuple[object, float]:
    start = time.perf_counter()
    result = run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return result, time.perf_counter() - start


@torch.inference_mode()
def measure_stage_costs(loaded: LoadedModel, config: EngineConfig, samples_full_vocabulary: bool,
                        threads: int) -> StageCosts:
    """Median seconds per layer and for the head over a few probe steps, at `threads` torch threads."""
    model = loaded.model
    device = model.output_weight.device
    batch = _probe_batch(loaded, config, samples_full_vocabulary)
    kv = allocate_kv_cache(loaded.arch, int(batch.meta.decode_block_tables.shape[1]), config.cache.block_size,
                           model.output_weight.dtype, device)
    backend = backend_for(config, device)
    ops = layer_ops(device, config, [model])
    layer_times: list[list[float]] = [[] for _ in model.layers]
    head_times: list[float] = []
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for repeat in range(_REPEATS + 1):  # the first pass warms caches and lazy weight packing
            hidden = model.embed(batch.input_ids)
            for index, cache in enumerate(kv):
                hidden, seconds = _timed(lambda: model.run_layers(hidden, batch.positions, [cache], batch.meta,
                                                                  backend, ops, range(index, index + 1)), device)
                if repeat:
                    layer_times[index].append(seconds)
            hidden = model.norm(hidden, ops)
            _, seconds = _timed(lambda: compute_output_logits(model, hidden, batch, ops), device)
            if repeat:
                head_times.append(seconds)
    finally:
        torch.set_num_threads(previous_threads)
    return StageCosts([statistics.median(times) for times in layer_times], statistics.median(head_times))
