"""CUDA graphs for score-only forwards (the PRM's): one graph per padded token count.

A PRM forward is a few prefill chunks (each beam's new step over its cached question and
earlier steps) read at their label positions. On a GPU such a forward of a small model is a
few hundred short kernels whose launches from Python cost more than the work (14 ms for
1.6 ms of device time on the demo PRM, docs/benchmarks/gpu_profile.md). A captured graph
launches them all at once.

Graphs read fixed addresses and fixed grid sizes, so a forward of `n` tokens in `s` chunks
is copied into `StaticScoreBuffers` and replays the graph of the smallest captured token
count ``padded >= n``:

* the chunks are described by a device tile table (`prefill_tiles.py`) sized for the most
  tiles ``padded`` tokens can take; tiles past the batch's are empty (no rows), so their
  programs read and write nothing;
* padding tokens ``[n, padded)`` have slot `PAD_SLOT`, which the Triton `store_kv` kernel
  skips, and no tile covers them: they write no KV and their attention rows are never read;
  every other op of the forward is row-wise, so they never reach a real row;
* a chunk's block-table row is read only up to its context, so rows are overwritten where the
  batch's tables reach and never cleared.

The graph ends at the final norm: which rows are scored, and against which candidate tokens,
changes every forward and costs a few launches, so the executor computes those logits from
the replay's hidden states. A runtime captures every size of its PRM's runner when it starts
(`capture_all`, largest first, so the smaller graphs reuse the largest's memory), as a server
captures before it serves: a capture mid-search would stall the device (two eager warm-ups, a
synchronisation) and its forward would stand out in the forward-cost fits and busy times.
Any other size is captured the first time it is needed, and an engine that never scores (the
generator) captures none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tts_runtime.executor.attention.attention import AttentionBackend
from tts_runtime.executor.attention.prefill_tiles import TILE_FIELDS, max_tiles, prefill_tile_table
from tts_runtime.executor.batch import AttentionMetadata, ModelInput
from tts_runtime.executor.cuda_graphs import PAD_SLOT, capture_sizes
from tts_runtime.models.decoder import DecoderModel
from tts_runtime.models.layers import LayerOps

# Powers of two, then steps of half a power: a forward pads by less than half its tokens.
DEFAULT_SCORE_TOKEN_SIZES: tuple[int, ...] = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


@dataclass
class StaticScoreBuffers:
    """Every input a captured score graph reads, at fixed addresses."""

    input_ids: torch.Tensor  # [max_tokens] int64
    positions: torch.Tensor  # [max_tokens] int64
    slot_mapping: torch.Tensor  # [max_tokens] int64
    block_tables: torch.Tensor  # [max_chunks, max_blocks_per_seq] int32, row i: the i-th chunk's blocks
    tiles: torch.Tensor  # [max_tiles(max_tokens), 4] int32
    block_size: int
    block_m: int  # query rows per tile: the attention backend's for this model

    @classmethod
    def allocate(cls, max_tokens: int, max_chunks: int, max_blocks_per_seq: int, block_size: int, block_m: int,
                 device: torch.device) -> StaticScoreBuffers:
        return cls(
            input_ids=torch.zeros(max_tokens, dtype=torch.long, device=device),
            positions=torch.zeros(max_tokens, dtype=torch.long, device=device),
            slot_mapping=torch.full((max_tokens,), PAD_SLOT, dtype=torch.long, device=device),
            block_tables=torch.zeros(max_chunks, max_blocks_per_seq, dtype=torch.int32, device=device),
            tiles=torch.zeros(max_tiles(max_tokens, max_chunks, block_m), TILE_FIELDS, dtype=torch.int32,
                              device=device),
            block_size=block_size,
            block_m=block_m,
        )

    @property
    def max_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def max_chunks(self) -> int:
        return self.block_tables.shape[0]

    def num_tiles(self, padded: int) -> int:
        """The tile rows (the prefill kernel's grid) of the graph for `padded` tokens."""
        return max_tiles(padded, self.max_chunks, self.block_m)

    def fits(self, batch: ModelInput) -> bool:
        """A score-only batch of prefill chunks (no decode, nothing sampled) that fits."""
        meta = batch.meta
        return (meta.num_decodes == 0 and 0 < meta.num_prefills <= self.max_chunks and bool(batch.score_rows)
                and batch.sample_rows.numel() == 0 and 0 < batch.input_ids.shape[0] <= self.max_tokens
                and meta.prefill_block_tables.shape[1] <= self.block_tables.shape[1])

    def fill(self, batch: ModelInput, padded: int) -> None:
        """Copy a batch into the buffers' first rows and make the rest of `padded` padding."""
        meta = batch.meta
        n = batch.input_ids.shape[0]
        assert n <= padded <= self.max_tokens, "padded size must hold the batch"
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.input_ids[n:padded].zero_()
        self.positions[n:padded].zero_()
        self.slot_mapping[n:padded].fill_(PAD_SLOT)
        chunks, width = meta.prefill_block_tables.shape
        self.block_tables[:chunks, :width].copy_(meta.prefill_block_tables, non_blocking=True)
        tiles = prefill_tile_table(meta.prefill_query_lens, meta.prefill_query_starts, meta.prefill_context_lens,
                                   self.block_m)
        used = tiles.shape[0]
        if self.tiles.is_cuda:
            tiles = tiles.pin_memory()
        self.tiles[:used].copy_(tiles, non_blocking=True)
        self.tiles[used:self.num_tiles(padded)].zero_()

    def clear(self, padded: int) -> None:
        """Every row padding and every tile empty: a forward over them writes no KV."""
        self.input_ids[:padded].zero_()
        self.positions[:padded].zero_()
        self.slot_mapping[:padded].fill_(PAD_SLOT)
        self.tiles[:self.num_tiles(padded)].zero_()

    def metadata(self, padded: int) -> AttentionMetadata:
        """Views of the buffers, so a graph captured with it reads whatever the latest `fill` wrote."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:padded],
            num_decodes=0,
            decode_block_tables=self.block_tables[:0],
            decode_context_lens=torch.zeros(0, dtype=torch.int32, device=self.block_tables.device),
            prefill_query_starts=[],
            prefill_query_lens=[],
            prefill_context_lens=[],
            prefill_block_tables=self.block_tables,
            block_size=self.block_size,
            prefill_tiles=self.tiles[:self.num_tiles(padded)],
        )


def padded_score_hidden(model: DecoderModel, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                        backend: AttentionBackend, ops: LayerOps, buffers: StaticScoreBuffers,
                        padded: int) -> torch.Tensor:
    """The forward a graph captures: rows [0, padded) of the buffers -> final hidden states."""
    return model(buffers.input_ids[:padded], buffers.positions[:padded], kv_caches, buffers.metadata(padded),
                 backend, ops)


class ScoreGraphRunner:
    """Replays score-only forwards from graphs, capturing each padded size on first use or all
    of them at once (`capture_all`)."""

    WARMUP_RUNS = 2  # eager runs before a capture: settle lazy allocations and kernel variants

    def __init__(self, model: DecoderModel, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 backend: AttentionBackend, ops: LayerOps, *, max_tokens: int, max_chunks: int,
                 max_blocks_per_seq: int, block_size: int,
                 sizes: Sequence[int] = DEFAULT_SCORE_TOKEN_SIZES) -> None:
        device = kv_caches[0][0].device
        if device.type != "cuda" or backend.name != "triton" or getattr(backend, "cascade", False):
            raise ValueError("score CUDA graphs need a CUDA device and the triton backend without cascade")
        self.model = model
        self.kv_caches = kv_caches
        self.backend = backend
        self.ops = ops
        self.sizes = capture_sizes(max_tokens, sizes)
        block_m = backend.tile_sizes(model.arch.head_dim, kv_caches[0][0].dtype)[0]
        self.buffers = StaticScoreBuffers.allocate(self.sizes[-1], max_chunks, max_blocks_per_seq, block_size,
                                                   block_m, device)
        self._pool = torch.cuda.graph_pool_handle()
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._hidden: dict[int, torch.Tensor] = {}

    @property
    def captured_sizes(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))

    def capture_all(self) -> None:
        for padded in reversed(self.sizes):
            if padded not in self._graphs:
                self._capture(padded)

    def padded_size(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def can_run(self, batch: ModelInput) -> bool:
        return self.buffers.fits(batch)

    def run(self, batch: ModelInput) -> torch.Tensor:
        """The final hidden states of a batch `can_run` accepted, valid until the next run."""
        n = batch.input_ids.shape[0]
        padded = self.padded_size(n)
        if padded not in self._graphs:
            self._capture(padded)
        self.buffers.fill(batch, padded)
        self._graphs[padded].replay()
        return self._hidden[padded][:n]

    @torch.inference_mode()
    def _capture(self, padded: int) -> None:
        device = self.buffers.input_ids.device
        # Another engine's forwards may be queued on other streams (overlap): let them finish,
        # and capture in thread-local mode so their waiting threads may synchronise meanwhile.
        torch.cuda.synchronize(device)
        self.buffers.clear(padded)  # warm-up and capture must not write the last batch's slots
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(self.WARMUP_RUNS):
                padded_score_hidden(self.model, self.kv_caches, self.backend, self.ops, self.buffers, padded)
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"):
            self._hidden[padded] = padded_score_hidden(self.model, self.kv_caches, self.backend, self.ops,
                                                       self.buffers, padded)
        torch.cuda.synchronize(device)
        self._graphs[padded] = graph
