"""CUDA graphs for decode-only steps: one graph per padded batch size over static inputs.

A decode step of a small model is a few hundred short kernels; launching them one by one
from Python costs more than running them. A captured graph replays the whole forward
(embedding to logits) with one launch. Graphs read fixed addresses, so every input lives
in `StaticDecodeBuffers`, sized for the largest captured batch; a step of `n` sequences
copies its inputs into rows ``[0, n)`` and replays the graph of the smallest captured
size ``padded >= n``. (This is also the one place the token-safe double buffering of the
pipelined engine will keep its second version of the inputs.)

Padding rows ``[n, padded)`` never touch real KV:

* their slot is `PAD_SLOT` (-1), which the Triton `store_kv` kernel skips, so they write
  no key or value anywhere;
* their context length is 1 over an all-zero block-table row, so their attention reads
  a single key (offset 0 of block 0; whatever finite values it holds) and writes only
  the padding row of the attention output;
* every other op of the forward is row-wise (embedding, projections, norms, rotary,
  activation, output layer), so a padding row's values never reach a real row.

Rows are reset to padding on every fill, so a smaller batch after a larger one never
replays the larger batch's stale slots (which would overwrite live KV).

Graphs require the `triton` backend (the torch backend's `index_copy_` cannot skip
slot -1) and share one memory pool; the logits a replay returns are valid until the
next replay, which the engine respects by sampling before it schedules the next step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tts_runtime.executor.attention.attention import AttentionBackend
from tts_runtime.executor.batch import AttentionMetadata, ModelInput, ModelOutput
from tts_runtime.models.decoder import DecoderModel
from tts_runtime.models.layers import LayerOps

PAD_SLOT = -1
# Small sizes exactly, then steps of 16: a batch pads by at most 15 rows.
DEFAULT_CAPTURE_SIZES: tuple[int, ...] = (1, 2, 4, 8, *range(16, 257, 16))


def capture_sizes(max_num_seqs: int, sizes: Sequence[int] = DEFAULT_CAPTURE_SIZES) -> tuple[int, ...]:
    """The sizes to capture for a scheduler that runs at most `max_num_seqs` sequences:
    those below it plus the cap itself (no graph is larger than the largest of `sizes`)."""
    cap = min(max_num_seqs, max(sizes))
    return tuple(sorted({s for s in sizes if s < cap} | {cap}))


@dataclass
class StaticDecodeBuffers:
    """Every input a captured decode graph reads, at fixed addresses.

    Row ``i`` describes the ``i``-th decode sequence of the step; rows past the step's
    batch are padding (`PAD_SLOT`, context length 1, zero block table, token 0 at
    position 0). `allocate` fills every row with padding.
    """

    input_ids: torch.Tensor  # [max_batch] int64
    positions: torch.Tensor  # [max_batch] int64
    slot_mapping: torch.Tensor  # [max_batch] int64
    block_tables: torch.Tensor  # [max_batch, max_blocks_per_seq] int32
    context_lens: torch.Tensor  # [max_batch] int32, the new token included
    block_size: int

    @classmethod
    def allocate(cls, max_batch: int, max_blocks_per_seq: int, block_size: int,
                 device: torch.device) -> StaticDecodeBuffers:
        return cls(
            input_ids=torch.zeros(max_batch, dtype=torch.long, device=device),
            positions=torch.zeros(max_batch, dtype=torch.long, device=device),
            slot_mapping=torch.full((max_batch,), PAD_SLOT, dtype=torch.long, device=device),
            block_tables=torch.zeros(max_batch, max_blocks_per_seq, dtype=torch.int32, device=device),
            context_lens=torch.ones(max_batch, dtype=torch.int32, device=device),
            block_size=block_size,
        )

    @property
    def max_batch(self) -> int:
        return self.input_ids.shape[0]

    @property
    def max_blocks_per_seq(self) -> int:
        return self.block_tables.shape[1]

    def fits(self, batch: ModelInput) -> bool:
        """A decode-only batch (every token a decode, all of them sampled) that fits."""
        meta = batch.meta
        n = meta.num_decodes
        return (0 < n <= self.max_batch and meta.num_prefills == 0 and not batch.score_rows
                and batch.input_ids.shape[0] == n and batch.sample_rows.shape[0] == n
                and meta.decode_block_tables.shape[1] <= self.max_blocks_per_seq)

    def fill(self, batch: ModelInput, padded: int) -> None:
        """Copy a decode-only batch into rows [0, n) and reset rows [n, padded) to padding.
        Device-side copies only: nothing here waits for the GPU."""
        meta = batch.meta
        n = meta.num_decodes
        assert n <= padded <= self.max_batch, "padded size must hold the batch"
        self.input_ids[:n].copy_(batch.input_ids, non_blocking=True)
        self.positions[:n].copy_(batch.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(meta.slot_mapping, non_blocking=True)
        self.context_lens[:n].copy_(meta.decode_context_lens, non_blocking=True)
        # Whole rows, zero past each table: the rows hold exactly this step's tables.
        self.block_tables[:padded].zero_()
        width = meta.decode_block_tables.shape[1]
        self.block_tables[:n, :width].copy_(meta.decode_block_tables, non_blocking=True)
        self.input_ids[n:padded].zero_()
        self.positions[n:padded].zero_()
        self.slot_mapping[n:padded].fill_(PAD_SLOT)
        self.context_lens[n:padded].fill_(1)

    def metadata(self, padded: int) -> AttentionMetadata:
        """Attention metadata over rows [0, padded): views of the buffers, so a graph
        captured with it reads whatever the latest `fill` wrote."""
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:padded],
            num_decodes=padded,
            decode_block_tables=self.block_tables[:padded],
            decode_context_lens=self.context_lens[:padded],
            prefill_query_starts=[],
            prefill_query_lens=[],
            prefill_context_lens=[],
            prefill_block_tables=self.block_tables[:0],
            block_size=self.block_size,
        )


def padded_decode_logits(model: DecoderModel, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                         backend: AttentionBackend, ops: LayerOps, buffers: StaticDecodeBuffers,
                         padded: int) -> torch.Tensor:
    """The forward a graph captures: rows [0, padded) of the buffers -> logits [padded, vocab]."""
    hidden = model(buffers.input_ids[:padded], buffers.positions[:padded], kv_caches,
                   buffers.metadata(padded), backend, ops)
    return model.compute_logits(hidden, ops=ops)


class CudaGraphRunner:
    """Captures decode graphs at construction and replays them for decode-only batches.

    Build it after the KV cache (the graphs bake in its addresses); the layer ops it is
    given are captured as they are. Capture runs largest size
    first so the smaller graphs fit in the memory the largest one already reserved.
    """

    # Eager runs per size before capture: they compile the size's Triton kernel variants
    # (a decode batch's key-split count depends on its size) and settle lazy allocations.
    WARMUP_RUNS = 2

    def __init__(self, model: DecoderModel, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 backend: AttentionBackend, ops: LayerOps, *, max_num_seqs: int, max_blocks_per_seq: int,
                 block_size: int, sizes: Sequence[int] = DEFAULT_CAPTURE_SIZES) -> None:
        device = kv_caches[0][0].device
        if device.type != "cuda" or backend.name != "triton":
            raise ValueError("decode CUDA graphs need a CUDA device and the triton attention backend")
        self.model = model
        self.kv_caches = kv_caches
        self.backend = backend
        self.ops = ops
        self.sizes = capture_sizes(max_num_seqs, sizes)
        self.buffers = StaticDecodeBuffers.allocate(self.sizes[-1], max_blocks_per_seq, block_size, device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._logits: dict[int, torch.Tensor] = {}
        self._capture(device)

    @torch.inference_mode()
    def _capture(self, device: torch.device) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        for size in reversed(self.sizes):
            # The buffers hold only padding here, so warm-up runs write no KV.
            with torch.cuda.stream(stream):
                for _ in range(self.WARMUP_RUNS):
                    padded_decode_logits(self.model, self.kv_caches, self.backend, self.ops, self.buffers, size)
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self._logits[size] = padded_decode_logits(self.model, self.kv_caches, self.backend,
                                                          self.ops, self.buffers, size)
            self._graphs[size] = graph
        torch.cuda.synchronize(device)

    def padded_size(self, n: int) -> int:
        return next(s for s in self.sizes if s >= n)

    def can_run(self, batch: ModelInput) -> bool:
        return self.buffers.fits(batch)

    def run(self, batch: ModelInput) -> ModelOutput:
        """Replay the graph for a batch `can_run` accepted; logits stay valid until the next run."""
        n = batch.meta.num_decodes
        padded = self.padded_size(n)
        self.buffers.fill(batch, padded)
        self._graphs[padded].replay()
        return ModelOutput(self._logits[padded][:n], [])
