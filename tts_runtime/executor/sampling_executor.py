"""A local executor that samples too, on the device, so that async scheduling acts on it.

When the engine samples (LocalExecutor alone), step N's tokens must reach the host before the
engine can build step N+1, and the device idles while the host processes N and schedules
N+1. Here the executor samples N's logits on the device right after N's forward and keeps the
tokens there. The engine may then launch N+1 before they reach the host: its going-ahead
decodes carry a placeholder input (`SamplePlan.filled_from`) that this executor overwrites
with N's token by a device-side copy queued behind N's sampling. On CUDA the host reads N's
tokens from a pinned buffer once an event says they are there, in a waiting thread, so no
launch waits on the device.

Only a row with penalties reads its earlier tokens (repetition and frequency counts): for
such a going-ahead row the placeholder is resolved on the host too, by waiting for N's tokens.

On a CPU the forward runs inside `submit`, so nothing overlaps: it changes where sampling
runs, not when (tested there for its results; `--executor-sampling` is for CUDA).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor

import torch

from tts_runtime.executor.batch import ModelInput, ModelOutput, SamplePlan
from tts_runtime.executor.host_copy import values_on_device
from tts_runtime.executor.local import LocalExecutor
from tts_runtime.executor.sampler import sample_on_device


class SamplingExecutor:
    depth = 1
    samples = True
    fills_placeholders = True

    def __init__(self, inner: LocalExecutor, seed: int) -> None:
        self.inner = inner
        self.device = inner.kv_caches[0][0].device
        # The engine's own stream for unseeded rows, seeded alike: the same draws in the same order.
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._last_tokens = torch.empty(0, dtype=torch.long, device=self.device)
        self._last_output: Future[ModelOutput] | None = None
        self._waiter = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts-sampled-tokens")
                        if self.device.type == "cuda" else None)

    def can_launch(self) -> bool:
        return True

    @torch.inference_mode()
    def submit(self, batch: ModelInput, sample_plan: SamplePlan | None = None) -> Future[ModelOutput]:
        if sample_plan is None:
            return self.inner.submit(batch)
        if sample_plan.filled_from:
            self._fill_placeholders(batch, sample_plan)
        output = self.inner.execute(batch)
        tokens = self._last_tokens[:0]
        if sample_plan.rows:
            logits = output.sample_logits
            if len(sample_plan.logit_rows) != logits.shape[0]:  # forked children sample their parent's row
                logits = logits[values_on_device(sample_plan.logit_rows, torch.long, logits.device)]
            tokens = sample_on_device(logits, sample_plan.rows, self.generator)
        self._last_tokens = tokens
        self._last_output = self._deliver(tokens, output.score_logits)
        return self._last_output

    def _fill_placeholders(self, batch: ModelInput, plan: SamplePlan) -> None:
        rows = [row for row, _ in plan.filled_from]
        previous = [prev for _, prev in plan.filled_from]
        device = batch.input_ids.device
        batch.input_ids[values_on_device(rows, torch.long, device)] = \
            self._last_tokens[values_on_device(previous, torch.long, device)]
        penalised = [(row, prev) for row, prev in plan.filled_from if plan.rows[row].params.uses_penalties]
        if penalised:
            tokens = self._last_output.result().sampled_tokens
            for row, prev in penalised:
                plan.rows[row].filled_token = tokens[prev]

    def _deliver(self, tokens: torch.Tensor, score_logits: list[torch.Tensor]) -> Future[ModelOutput]:
        if self._waiter is None:  # the forward and its sampling are done
            future: Future[ModelOutput] = Future()
            future.set_result(ModelOutput(torch.empty(0), score_logits, tokens.tolist()))
            return future
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record()

        def finish() -> ModelOutput:
            copied.synchronize()
            return ModelOutput(torch.empty(0), score_logits, host.tolist())

        return self._waiter.submit(finish)

    def capture_score_graphs(self) -> None:
        self.inner.capture_score_graphs()

    def shutdown(self) -> None:
        if self._waiter is not None:
            self._waiter.shutdown(wait=True)
        self.inner.shutdown()
