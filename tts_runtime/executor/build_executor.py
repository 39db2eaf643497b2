"""Builds the device side of one engine: KV memory, attention backend, layer ops, CUDA
graphs, and the executor that runs forwards with them."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

from tts_runtime.config import EngineConfig
from tts_runtime.executor.attention.backends import AttentionBackend, backend_for
from tts_runtime.executor.batch import ModelInput, ModelOutput, SamplePlan
from tts_runtime.executor.cuda_graphs import CudaGraphRunner
from tts_runtime.executor.kv_cache import KVAllocation, KVCaches, allocate_kv_cache
from tts_runtime.executor.sim import build_sim_executor, is_sim_device
from tts_runtime.executor.layer_ops import layer_ops
from tts_runtime.executor.local import LocalExecutor
from tts_runtime.executor.sampling_executor import SamplingExecutor
from tts_runtime.executor.score_graphs import ScoreGraphRunner
from tts_runtime.executor.pipeline.pipeline import PipelineGroup, StageModel
from tts_runtime.models.layers import LayerOps
from tts_runtime.models.loader import LoadedModel


class Executor(Protocol):
    depth: int  # most microbatches the engine may keep in flight
    samples: bool  # True: submit's plan is sampled by the executor (ModelOutput.sampled_tokens)

    def can_launch(self) -> bool: ...

    def submit(self, batch: ModelInput, sample_plan: SamplePlan | None = None) -> Future[ModelOutput]: ...

    def shutdown(self) -> None: ...


def _max_blocks_per_seq(loaded: LoadedModel, block_size: int, num_blocks: int) -> int:
    """A sequence never holds more blocks than its context or the pool allows."""
    return min(-(-loaded.arch.max_position_embeddings // block_size), num_blocks)


def decode_graphs(loaded: LoadedModel, kv_caches: KVCaches, backend: AttentionBackend, ops: LayerOps,
                  config: EngineConfig, num_blocks: int) -> CudaGraphRunner | None:
    """Decode CUDA graphs on CUDA with the triton backend; never built on CPU."""
    device = kv_caches[0][0].device
    if not (device.type == "cuda" and config.cuda_graphs and backend.name == "triton"):
        return None
    block_size = config.cache.block_size
    return CudaGraphRunner(loaded.model, kv_caches, backend, ops, max_num_seqs=config.scheduler.max_num_seqs,
                           max_blocks_per_seq=_max_blocks_per_seq(loaded, block_size, num_blocks),
                           block_size=block_size)


def score_graphs(loaded: LoadedModel, kv_caches: KVCaches, backend: AttentionBackend, ops: LayerOps,
                 config: EngineConfig, num_blocks: int) -> ScoreGraphRunner | None:
    """Score-forward CUDA graphs on CUDA with the triton backend (not its cascade path, whose
    plan is host data per batch); never built on CPU. Nothing is captured until a score forward
    needs it, so a generator's runner stays empty."""
    device = kv_caches[0][0].device
    if not (device.type == "cuda" and config.score_graphs and backend.name == "triton"
            and not getattr(backend, "cascade", False)):
        return None
    block_size = config.cache.block_size
    scheduler = config.scheduler
    return ScoreGraphRunner(loaded.model, kv_caches, backend, ops, max_tokens=scheduler.max_num_batched_tokens,
                            max_chunks=scheduler.max_num_seqs,
                            max_blocks_per_seq=_max_blocks_per_seq(loaded, block_size, num_blocks),
                            block_size=block_size)


def build_local_executor(loaded: LoadedModel, config: EngineConfig, num_blocks: int,
                         kv: KVAllocation | None = None) -> LocalExecutor:
    weight = loaded.model.output_weight
    device, dtype = weight.device, weight.dtype
    caches = kv.caches if kv is not None else allocate_kv_cache(
        loaded.arch, num_blocks, config.cache.block_size, dtype, device, config.cache.lazy_kv_zeroing)
    backend = backend_for(config, device)
    ops = layer_ops(device, config, [loaded.model])
    return LocalExecutor(loaded.model, caches, backend, ops,
                         decode_graphs(loaded, caches, backend, ops, config, num_blocks), config.prune_last_layer,
                         score_graphs(loaded, caches, backend, ops, config, num_blocks))


def build_executor(loaded: LoadedModel, config: EngineConfig, num_blocks: int,
                   kv: KVAllocation | None = None) -> Executor:
    """An engine's own device side: local at pp 1, else a pipeline of stage processes
    serving this one model (a runtime builds one pipeline for both of its models)."""
    if is_sim_device(config.device):
        return build_sim_executor(config.device, config.seed)
    if config.parallel.pp_size == 1:
        local = build_local_executor(loaded, config, num_blocks, kv)
        return SamplingExecutor(local, config.seed) if config.executor_sampling else local
    group = PipelineGroup([StageModel.of("model", loaded, num_blocks)], config)
    return group.executor("model", owns_group=True)
