"""Overlapped generator and PRM: both engines' forwards run at the same time.

On CPU each engine's forward runs in its own worker process: a one-stage pipeline group
(executor/pipeline/pipeline.py: spawned process, ZeroMQ control, results on a receiving thread)
per model, each with its share of the cores. Under pipeline parallelism (pp > 1) the
runtime's one group of stages already serves both models; there the two engines' microbatches
are launched in turn into it, so each fills the other's pipeline bubbles. On CUDA each
engine's forward is queued on its own stream and a waiting thread resolves its future when
the stream's work is done, so the GPU runs both models' kernels concurrently.

`OverlapStepper` is the runtime's step under overlap: launch every chosen engine's
microbatches in turn while each has room (launching never waits), then complete the first
microbatch to finish, whichever engine it belongs to. The driver samples and processes one
engine's results while the other engine's forward still runs, and the searches woken by
those results queue their next requests before the next step.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import replace

import torch

from tts_runtime.config import EngineConfig
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import RequestOutput
from tts_runtime.executor.batch import ModelInput, ModelOutput, SamplePlan
from tts_runtime.executor.local import LocalExecutor
from tts_runtime.executor.pipeline.pipeline import PipelineGroup, StageModel


def worker_group(model: StageModel, config: EngineConfig, threads: int) -> PipelineGroup:
    """One engine's forward in its own process: a pipeline group of one stage and one model."""
    parallel = replace(config.parallel, pp_size=1, pp_layers=None, threads_per_stage=threads)
    return PipelineGroup([model], replace(config, parallel=parallel), name=f"{model.key} worker")


def worker_threads(config: EngineConfig) -> int:
    """Torch threads per worker: --threads-per-stage, else half the cores (the two workers
    run at once)."""
    return config.parallel.threads_per_stage or max(1, (os.cpu_count() or 1) // 2)


class StreamExecutor:
    """A local executor whose forwards are queued on a CUDA stream of their own; the future
    resolves (on a waiting thread) once the stream has finished them."""

    depth = 1
    samples = False

    def __init__(self, inner: LocalExecutor, device: torch.device) -> None:
        self.inner = inner
        self.stream = torch.cuda.Stream(device)
        self._waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts-stream-wait")

    def can_launch(self) -> bool:
        return True

    def submit(self, batch: ModelInput, sample_plan: SamplePlan | None = None) -> Future[ModelOutput]:
        launcher = torch.cuda.current_stream(self.stream.device)
        # The inputs were copied to the device on the launching stream: wait for them.
        self.stream.wait_stream(launcher)
        with torch.cuda.stream(self.stream):
            output = self.inner.execute(batch)
            done = torch.cuda.Event()
            done.record(self.stream)

        def finish(inputs: ModelInput = batch) -> ModelOutput:
            # `inputs` holds the batch's device tensors until the forward reading them is done.
            done.synchronize()
            # The launching stream reads these next; the allocator must not hand their memory
            # back to this stream before it has.
            for tensor in [output.sample_logits, *output.score_logits]:
                tensor.record_stream(launcher)
            return output

        return self._waiter.submit(finish)

    def shutdown(self) -> None:
        self._waiter.shutdown(wait=True)
        self.inner.shutdown()


class OverlapStepper:
    def __init__(self, engines: dict[str, Engine], on_launch: Callable[[str], None]) -> None:
        self.engines = engines
        self.on_launch = on_launch

    def step(self, chosen: list[str]) -> list[tuple[str, list[RequestOutput]]]:
        """Launch what `chosen` engines can, then complete one microbatch (of any engine with
        one in flight): [(engine name, its finished requests)]."""
        self.fill(chosen)
        heads = {name: engine.oldest_in_flight() for name, engine in self.engines.items()
                 if engine.num_in_flight}
        if not heads:
            stuck = [name for name in chosen if self.engines[name].has_unfinished_requests()]
            if stuck:
                raise RuntimeError(f"{' and '.join(stuck)} made no progress with requests pending")
            return []
        started = time.perf_counter()
        wait(heads.values(), return_when=FIRST_COMPLETED)
        name = next(name for name, future in heads.items() if future.done())
        engine = self.engines[name]
        engine.host_times.add("wait", started)  # as its own collect counts a wait for its result
        return [(name, engine.collect())]

    def fill(self, chosen: list[str]) -> None:
        """One microbatch per engine in turn, so neither takes every slot of a shared pipeline."""
        launched = True
        while launched:
            launched = False
            for name in chosen:
                if self.engines[name].launch(limit=1):
                    self.on_launch(name)
                    launched = True
