"""The local executor: the whole model in the driver's process (pipeline degree 1).

`submit` returns a future so the engine drives every executor alike; a pipeline keeps
several microbatches in flight, this one resolves each at once."""

from __future__ import annotations

from concurrent.futures import Future

import torch

from tts_runtime.executor.attention.attention import AttentionBackend
from tts_runtime.executor.batch import ModelInput, ModelOutput, SamplePlan
from tts_runtime.executor.cuda_graphs import CudaGraphRunner
from tts_runtime.executor.host_copy import values_on_device
from tts_runtime.executor.kv_cache import KVCaches, copy_blocks
from tts_runtime.executor.score_graphs import ScoreGraphRunner
from tts_runtime.models.decoder import DecoderModel
from tts_runtime.models.layers import EAGER_OPS, LayerOps


class LocalExecutor:
    """Runs the model with the layer ops and attention backend it was built with. With
    `graphs` (CUDA only), decode-only batches the runner accepts replay a captured graph; with
    `score_graphs`, so do score-only batches up to their final hidden states.
    `prune_last_layer`: the last layer runs past attention only on the rows whose logits are
    read (`output_rows`)."""

    depth = 1  # microbatches in flight
    samples = False  # the driver samples the logits it returns

    def __init__(self, model: DecoderModel, kv_caches: KVCaches, backend: AttentionBackend,
                 ops: LayerOps = EAGER_OPS, graphs: CudaGraphRunner | None = None,
                 prune_last_layer: bool = False, score_graphs: ScoreGraphRunner | None = None) -> None:
        self.model = model
        self.prune_last_layer = prune_last_layer
        self.kv_caches = kv_caches
        self.backend = backend
        self.ops = ops
        self.graphs = graphs
        self.score_graphs = score_graphs

    def can_launch(self) -> bool:
        return True

    def submit(self, batch: ModelInput, sample_plan: SamplePlan | None = None) -> Future[ModelOutput]:
        future: Future[ModelOutput] = Future()
        future.set_result(self.execute(batch))
        return future

    @torch.inference_mode()
    def execute(self, batch: ModelInput) -> ModelOutput:
        if batch.block_copies is not None:
            copy_blocks(self.kv_caches, batch.block_copies)
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs.run(batch)
        if self.score_graphs is not None and self.score_graphs.can_run(batch):
            return compute_output_logits(self.model, self.score_graphs.run(batch), batch, self.ops)
        rows = output_rows(batch) if self.prune_last_layer else None
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta, self.backend, self.ops,
                            rows)
        return compute_output_logits(self.model, hidden, batch, self.ops, rows)

    def capture_score_graphs(self) -> None:
        """Every score graph now (a no-op without them: off, or not on CUDA)."""
        if self.score_graphs is not None:
            self.score_graphs.capture_all()

    def shutdown(self) -> None:
        pass


def output_rows(batch: ModelInput) -> torch.Tensor | None:
    """The rows whose logits are read (sampled or scored), in order; None where that is every
    row (a decode-only batch), so that nothing is selected for nothing."""
    num_rows = batch.input_ids.shape[0]
    if batch.read_rows is not None:
        return None if len(batch.read_rows) == num_rows else values_on_device(batch.read_rows, torch.long,
                                                                              batch.input_ids.device)
    # A batch from the wire (a pipeline stage's, on the host) or built by hand.
    rows = torch.cat([batch.sample_rows, *(r for r, _ in batch.score_rows)]).unique()
    return None if rows.numel() == num_rows else rows


def compute_output_logits(model: DecoderModel, hidden: torch.Tensor, batch: ModelInput,
                          ops: LayerOps, rows: torch.Tensor | None = None) -> ModelOutput:
    """Only the rows that are used, and for scores only the candidate columns. `rows`: the
    batch rows `hidden` holds, in order, where it holds only those (output_rows)."""
    def at(wanted: torch.Tensor) -> torch.Tensor:
        return hidden[wanted if rows is None else torch.searchsorted(rows, wanted)]

    sample_logits = model.compute_logits(at(batch.sample_rows), ops=ops)
    score_logits = [model.compute_logits(at(wanted), columns, ops) for wanted, columns in batch.score_rows]
    return ModelOutput(sample_logits, score_logits)
