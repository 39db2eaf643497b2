"""Executors run one model forward for a scheduled batch and return its logits.

`submit` returns a future so an engine can keep several microbatches in flight when the
executor is a pipeline of stage processes; the local executor resolves it at once."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from tts_runtime.engine.attention import AttentionBackend, AttentionMetadata
from tts_runtime.models.decoder import DecoderModel

if TYPE_CHECKING:  # cuda_graphs imports this module for ModelInput/ModelOutput
    from tts_runtime.engine.cuda_graphs import CudaGraphRunner


@dataclass
class ModelInput:
    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # rows of the flat batch whose full-vocabulary logits are sampled
    # Score rows grouped by candidate set: (rows, candidate token ids).
    score_rows: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list)


@dataclass
class ModelOutput:
    sample_logits: torch.Tensor  # [len(sample_rows), vocab]
    score_logits: list[torch.Tensor]  # per score group: [rows, candidates]


class LocalExecutor:
    """Runs the whole model in this process (pipeline degree 1). With `graphs` (CUDA
    only), decode-only batches the runner accepts replay a captured CUDA graph."""

    def __init__(self, model: DecoderModel, kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
                 backend: AttentionBackend, graphs: CudaGraphRunner | None = None) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.backend = backend
        self.graphs = graphs

    def submit(self, batch: ModelInput) -> Future[ModelOutput]:
        future: Future[ModelOutput] = Future()
        future.set_result(self.execute(batch))
        return future

    @torch.inference_mode()
    def execute(self, batch: ModelInput) -> ModelOutput:
        if self.graphs is not None and self.graphs.can_run(batch):
            return self.graphs.run(batch)
        hidden = self.model(batch.input_ids, batch.positions, self.kv_caches, batch.meta, self.backend)
        return compute_output_logits(self.model, hidden, batch)

    def shutdown(self) -> None:
        pass


def compute_output_logits(model: DecoderModel, hidden: torch.Tensor, batch: ModelInput) -> ModelOutput:
    """Only the rows that are used, and for scores only the candidate columns."""
    sample_logits = model.compute_logits(hidden[batch.sample_rows])
    score_logits = [model.compute_logits(hidden[rows], columns) for rows, columns in batch.score_rows]
    return ModelOutput(sample_logits, score_logits)
