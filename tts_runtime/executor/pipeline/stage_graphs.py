"""CUDA graphs for a pipeline stage's decode microbatches, one set per input-buffer parity.

A GPU stage's slice of a decode step (the embedding on the first stage, then its layers)
is captured per padded batch size over static inputs, as the whole-model graphs of
cuda_graphs.py are; the last stage's final norm and output head stay eager (the head runs
on the rows it needs only). Token-safe execution fills microbatch i+1's inputs
while microbatch i computes, so each parity (microbatch mod 2) owns its static buffers,
its graphs and their memory pool: the preparing thread fills a parity's buffers only
after the microbatch that last used them has been issued here, and every copy and replay
runs on the stage's one CUDA stream, so the fill runs after that microbatch's kernels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from tts_runtime.executor.attention.attention import AttentionBackend
from tts_runtime.executor.batch import ModelInput
from tts_runtime.executor.cuda_graphs import DEFAULT_CAPTURE_SIZES, StaticDecodeBuffers, capture_sizes
from tts_runtime.models.decoder import DecoderModel
from tts_runtime.models.layers import LayerOps


class StageGraphs:
    """One parity's decode graphs for one model's slice on one stage."""

    WARMUP_RUNS = 2  # compile each size's Triton variants before capture

    def __init__(self, model: DecoderModel, layers: range, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 backend: AttentionBackend, ops: LayerOps, *, first: bool, max_num_seqs: int,
                 max_blocks_per_seq: int, block_size: int, sizes: Sequence[int] = DEFAULT_CAPTURE_SIZES) -> None:
        device = kv_caches[0][0].device
        if device.type != "cuda" or backend.name != "triton":
            raise ValueError("stage CUDA graphs need a CUDA device and the triton attention backend")
        self.model, self.layers, self.kv_caches = model, layers, kv_caches
        self.backend, self.ops = backend, ops
        self.first = first
        self.sizes = capture_sizes(max_num_seqs, sizes)
        self.buffers = StaticDecodeBuffers.allocate(self.sizes[-1], max_blocks_per_seq, block_size, device)
        # The received activation (all but the first stage); padding rows keep finite values.
        self.hidden = torch.zeros(self.sizes[-1], model.arch.hidden_size, dtype=kv_caches[0][0].dtype,
                                  device=device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self._capture(device)

    def _forward(self, padded: int) -> torch.Tensor:
        x = self.model.embed(self.buffers.input_ids[:padded]) if self.first else self.hidden[:padded]
        return self.model.run_layers(x, self.buffers.positions[:padded], self.kv_caches,
                                     self.buffers.metadata(padded), self.backend, self.ops, self.layers)

    @torch.inference_mode()
    def _capture(self, device: torch.device) -> None:
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        for size in reversed(self.sizes):  # largest first: the smaller ones fit in its memory
            with torch.cuda.stream(stream):  # the buffers hold padding only: no KV is written
                for _ in range(self.WARMUP_RUNS):
                    self._forward(size)
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self._outputs[size] = self._forward(size)
            self._graphs[size] = graph
        torch.cuda.synchronize(device)

    def prepare(self, batch: ModelInput) -> int | None:
        """Fill the static buffers with a decode-only batch that fits and return its padded
        size; None (nothing written) for any other batch, which runs eagerly."""
        meta = batch.meta
        n = meta.num_decodes
        fits = (0 < n <= self.buffers.max_batch and meta.num_prefills == 0 and batch.input_ids.shape[0] == n
                and meta.decode_block_tables.shape[1] <= self.buffers.max_blocks_per_seq)
        if not fits:
            return None
        padded = next(s for s in self.sizes if s >= n)
        self.buffers.fill(batch, padded)
        return padded

    def replay(self, padded: int, rows: int, hidden: torch.Tensor | None) -> torch.Tensor:
        """The slice's output rows [0, rows) for the batch `prepare` filled; `hidden` is the
        received activation (None on the first stage). Valid until this parity's next replay."""
        if not self.first:
            self.hidden[:rows].copy_(hidden)
        self._graphs[padded].replay()
        return self._outputs[padded][:rows]
