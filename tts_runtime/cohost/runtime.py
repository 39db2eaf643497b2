"""Runtime: co-hosts the generator and the PRM on one device and one memory budget.

Callers enqueue generate/score requests and get asyncio futures (or use the blocking
helpers). One driver steps the engines while any future is pending, so requests from every
in-flight search share the engines' batches. Which engine steps when is the phase policy's
choice (tts_runtime/cohost/phases.py: alternate every step, or Seesaw-style batched phases); with
`overlap` both engines' forwards run at once (tts_runtime/cohost/overlap.py: a worker process each
on CPU, a CUDA stream each on a GPU, both models' microbatches in one pipeline under pp > 1,
both queued behind each other on the simulated device, as on one GPU stream).

Memory: both models are profiled (weights, peak activations of a forward at the token
budget, non-torch), the budget left for KV is split by the memory policy (memory/split.py),
and, under `elastic`, the two engines' KV lives in one chunked pool whose free chunks move
between steps to the starved engine (memory/pool.py, memory/elastic.py). A thrash tracker
listens to each engine's block events; `memory_metrics()` reports all of it.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import asdict, dataclass, fields, replace

import torch

from memory.elastic import ElasticPolicy, Pressure
from memory.pool import ElasticKVPool
from memory.profile import MemoryProfile, ProfileCache, profile_model
from memory.split import MemoryConfig, MemoryPlan, Workload, plan_memory
from memory.thrash import ThrashTracker
from tts_runtime.cohost.stats import CohostCounters, EngineCounters
from tts_runtime.config import (CacheConfig, CohostConfig, ConfigError, EngineConfig, ModelSpec, ParallelConfig, resolve_device,
                                resolve_dtype, resolve_phase_policy)
from tts_runtime.cohost.gc_freeze import frozen_heap
from tts_runtime.cohost.overlap import OverlapStepper, StreamExecutor, worker_group, worker_threads
from tts_runtime.cohost.phases import GENERATOR, PRM, PhaseScheduler
from tts_runtime.cohost.vllm_engine import VllmEngine, require_vllm
from tts_runtime.engine.busy import BusyClock
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import RequestOutput, SamplingParams, ScoreParams
from tts_runtime.executor.build_executor import build_local_executor
from tts_runtime.executor.device_memory import device_memory_info, return_freed_host_memory
from tts_runtime.executor.kv_cache import KVAllocation, bytes_per_block, element_size, shared_kv_views
from tts_runtime.executor.layer_ops import packed_weight_bytes, resolved_linear_backend
from tts_runtime.executor.pipeline.pipeline import PipelineGroup, StageModel
from tts_runtime.executor.profiling_forward import EngineRole, profile_tokens, profiling_forward
from tts_runtime.executor.sim import is_sim_device, sim_costs_for
from tts_runtime.models.loader import LoadedModel, load_model
from tts_runtime.paths import cache_root

BACKENDS = ("native", "vllm")
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


@dataclass
class RuntimeStats:
    generator: dict
    prm: dict


def _load(model: ModelSpec | str | LoadedModel, device: torch.device) -> tuple[ModelSpec, LoadedModel]:
    """A spec and its loaded model; an already loaded model is reused (sweeps build many runtimes)."""
    if isinstance(model, LoadedModel):
        return ModelSpec(model.name, _DTYPE_NAMES[model.dtype]), model
    spec = ModelSpec(model) if isinstance(model, str) else model
    return spec, load_model(spec.model, resolve_dtype(spec.dtype, device), device)


def profile_one(loaded: LoadedModel, role: EngineRole, config: EngineConfig,
                cache: ProfileCache | None = None) -> MemoryProfile:
    """Memory profile of one loaded model in an engine of this config (cached on disk)."""
    weight = loaded.model.output_weight
    tokens = profile_tokens(loaded, config.scheduler.max_num_batched_tokens)
    key = {"model": loaded.name, "dtype": str(weight.dtype), "device": str(weight.device), "role": role,
           "tokens": tokens, "max_num_seqs": config.scheduler.max_num_seqs,
           "block_size": config.cache.block_size, "attention": config.attention_backend,
           "linear": resolved_linear_backend(weight.device, config, weight.dtype)}
    cached = cache.get(key) if cache is not None else None
    if cached is not None:
        return cached
    forward = profiling_forward(loaded, tokens, config.scheduler.max_num_seqs, role, config.cache.block_size,
                                config.attention_backend)
    arch = loaded.arch
    tables = arch.vocab_size * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    profile = profile_model(loaded.name, loaded.model, arch.kv_bytes_per_token(weight.element_size()),
                            arch.num_layers, config.cache.block_size, tokens, forward, weight.device,
                            lambda: device_memory_info(weight.device).non_torch,
                            flops_per_token=2 * (arch.num_parameters() - tables),
                            packed_weights_bytes=packed_weight_bytes(loaded.model, role == "generate",
                                                                     weight.device, config))
    if cache is not None:
        cache.put(key, profile)
    return profile


def device_total(device: str) -> int | None:
    """The GPU's total memory (NVML), the simulated device's (its cost file's); None on CPU,
    where the user sets the budget."""
    if is_sim_device(device):
        return sim_costs_for(device).device_memory
    resolved = resolve_device(device)
    return device_memory_info(resolved).total if resolved.type == "cuda" else None


def host_available(device: str) -> int | None:
    """On CPU, the host memory free now, which the KV caches must fit in; None on a GPU and
    on the simulated device (its KV is a model's, not memory)."""
    if is_sim_device(device) or resolve_device(device).type != "cpu":
        return None
    return device_memory_info("cpu").free


def profile_models(generator: LoadedModel, prm: LoadedModel, config: EngineConfig) -> tuple[MemoryProfile, MemoryProfile]:
    """Profiles of the co-hosted pair: the generator samples, the PRM only scores."""
    cache = ProfileCache(cache_root() / "profiles")
    return profile_one(generator, "generate", config, cache), profile_one(prm, "score", config, cache)


def check_backend(backend: str, memory_policy: str) -> None:
    """One-line errors for a backend that cannot run, before minutes of loading."""
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend '{backend}'; choose one of {', '.join(BACKENDS)}")
    if backend == "vllm":
        require_vllm(memory_policy)


def check_cohost(backend: str, memory_policy: str, cohost: CohostConfig) -> None:
    """One-line errors for co-hosting settings that cannot run together."""
    if backend == "vllm" and (cohost.overlap or cohost.phase_policy == "batched" or cohost.hide_driver):
        raise ConfigError("--overlap, --hide-driver and --phase-policy batched drive our engine's launch and collect "
                          "halves; vLLM engines step whole: use them with --backend native")
    if cohost.overlap and memory_policy == "elastic":
        raise ConfigError("--overlap runs each engine's forward in a worker of its own, but the elastic "
                          "policy's KV pool lives in this process: use --memory-policy static or auto")


def check_host_tier(cache: CacheConfig, backend: str, cohost: CohostConfig) -> None:
    """The host KV tier copies blocks of KV held in this process: one-line errors where it is not."""
    if not cache.host_kv_bytes:
        return
    if backend != "native":
        raise ConfigError("--host-kv-memory is a native-engine feature; drop it with --backend vllm")
    if cohost.overlap:
        raise ConfigError("--host-kv-memory needs the KV cache in this process; --overlap moves each model's "
                          "forward (and KV) to a worker: drop one of the two")


def check_parallel(backend: str, memory_policy: str, parallel: ParallelConfig) -> None:
    """Pipeline stages hold each model's layers and KV in processes of their own."""
    if parallel.pp_size == 1:
        return
    if backend == "vllm":
        raise ConfigError("--pp splits the native engine's layers into stage processes; the vLLM backend "
                          "runs each model whole in this process: use --pp 1 with --backend vllm")
    if memory_policy == "elastic":
        raise ConfigError("the elastic memory policy needs --pp 1 (its KV pool lives in one process); "
                          "use --memory-policy static or auto with pipeline parallelism")


class Runtime:
    def __init__(self, generator: ModelSpec | str | LoadedModel, prm: ModelSpec | str | LoadedModel,
                 memory: MemoryConfig | None = None, engine_config: EngineConfig | None = None, *,
                 device: str | None = None, parallel: ParallelConfig | None = None, workload: Workload | None = None,
                 profiles: tuple[MemoryProfile, MemoryProfile] | None = None, backend: str = "native") -> None:
        """`device` and `parallel` (pipeline stages) override engine_config's; `workload`
        informs the auto and elastic policies; `profiles` skips profiling (a sweep profiles
        once for every setting);
        `backend`: "native" (our engine) or "vllm" (each model on a vLLM engine, sized by
        the same memory plan; see tts_runtime/cohost/vllm_engine.py)."""
        self.backend = backend
        return_freed_host_memory()  # an earlier runtime's KV, before this one allocates its own
        self.engine_config = engine_config or EngineConfig()
        if device is not None:
            self.engine_config = replace(self.engine_config, device=device)
        if parallel is not None:
            self.engine_config = replace(self.engine_config, parallel=parallel)
        self.memory = memory or MemoryConfig()
        check_backend(backend, self.memory.policy)
        check_cohost(backend, self.memory.policy, self.engine_config.cohost)
        check_host_tier(self.engine_config.cache, backend, self.engine_config.cohost)
        check_parallel(backend, self.memory.policy, self.engine_config.parallel)
        dev = resolve_device(self.engine_config.device)
        self.cohost = replace(self.engine_config.cohost, phase_policy=resolve_phase_policy(
            self.engine_config.cohost.phase_policy, dev, backend))
        gen_spec, gen_loaded = _load(generator, dev)
        prm_spec, prm_loaded = _load(prm, dev)
        self.profiles = profiles or profile_models(gen_loaded, prm_loaded, self.engine_config)
        self.plan: MemoryPlan = plan_memory(
            self.memory, *self.profiles, device_total=device_total(self.engine_config.device), workload=workload,
            element_sizes=(element_size(gen_loaded.dtype), element_size(prm_loaded.dtype)),
            host_available=host_available(self.engine_config.device))
        self.pool: ElasticKVPool | None = None
        self.elastic: ElasticPolicy | None = None
        self.pipeline: PipelineGroup | None = None
        self.workers: list[PipelineGroup] = []  # overlap at pp 1 on CPU: one process per engine
        # vLLM emits no block events: nothing for thrash trackers to follow there.
        self.trackers = {} if backend == "vllm" else {GENERATOR: ThrashTracker(), PRM: ThrashTracker()}
        self._start_engines((gen_spec, prm_spec), (gen_loaded, prm_loaded), dev)
        for name, tracker in self.trackers.items():
            self.engines[name].add_block_listener(tracker)
        # Either engine with a forward in flight: the device's busy time, counted once where
        # both engines' forwards are queued or run at the same time.
        self.device_busy = BusyClock()
        if backend != "vllm":
            for engine in self.engines.values():
                engine.busy.parent = self.device_busy
            self.prm.capture_score_graphs()
        self.num_steps = 0
        self._pending: dict[tuple[str, str], asyncio.Future | list] = {}
        self._ids = itertools.count()
        self.phases = PhaseScheduler(self.cohost)
        self.transitions = 0
        self._last_forward: str | None = None
        self.overlap = OverlapStepper(self.engines, self._note_forward) if self.cohost.overlap else None

    def _start_engines(self, specs: tuple[ModelSpec, ModelSpec], loaded: tuple[LoadedModel, LoadedModel],
                       dev: torch.device) -> None:
        """The two engines, placed as the backend, memory policy, pipeline and overlap ask."""
        if self.backend == "vllm":
            self._start_vllm(specs, loaded)
        elif self.plan.policy == "elastic":
            self._start_elastic(specs, loaded, dev)
        elif self.engine_config.parallel.pp_size > 1:
            self._start_pipelined(specs, loaded)
        elif self.cohost.overlap and not is_sim_device(self.engine_config.device):
            self._start_overlapped(specs, loaded, dev)
        else:  # on the simulated device overlap queues both engines' forwards on its one stream
            self.generator = Engine(specs[0], self.engine_config, loaded=loaded[0],
                                    num_blocks=self.plan.generator_blocks)
            self.prm = Engine(specs[1], self.engine_config, loaded=loaded[1], num_blocks=self.plan.prm_blocks)

    def _start_elastic(self, specs: tuple[ModelSpec, ModelSpec], loaded: tuple[LoadedModel, LoadedModel],
                       dev: torch.device) -> None:
        """Both engines on one pool of KV chunks that the elastic policy moves between them."""
        dtypes = (loaded[0].dtype, loaded[1].dtype)
        if dtypes[0] != dtypes[1]:
            raise ConfigError(f"elastic memory needs both models in one dtype (generator {dtypes[0]}, "
                              f"PRM {dtypes[1]}): a shared chunk is read in either; set --dtype")
        # The simulated device's forwards read no KV: its pool is bookkeeping over a buffer
        # with no storage, as large as the simulated card.
        kv_device = torch.device("meta") if is_sim_device(self.engine_config.device) else dev
        self.pool = ElasticKVPool.split(self.plan.chunks, GENERATOR, PRM, self.plan.prm_chunks, kv_device,
                                        self.engine_config.cache.lazy_kv_zeroing)
        self.generator = Engine(specs[0], self.engine_config, loaded=loaded[0],
                                kv=self._shared_kv(GENERATOR, loaded[0], dtypes[0]))
        self.prm = Engine(specs[1], self.engine_config, loaded=loaded[1],
                          kv=self._shared_kv(PRM, loaded[1], dtypes[1]))
        self.pool.attach(GENERATOR, self.generator.block_pool)
        self.pool.attach(PRM, self.prm.block_pool)
        block = self.engine_config.cache.block_size
        self.elastic = ElasticPolicy(self.pool, {GENERATOR: self.profiles[0].flops_per_token * block,
                                                 PRM: self.profiles[1].flops_per_token * block})

    def _start_pipelined(self, specs: tuple[ModelSpec, ModelSpec],
                         loaded: tuple[LoadedModel, LoadedModel]) -> None:
        """One set of stage processes holding both models' layer slices."""
        self.pipeline = PipelineGroup([
            StageModel.of(GENERATOR, loaded[0], self.plan.generator_blocks),
            StageModel.of(PRM, loaded[1], self.plan.prm_blocks, samples_full_vocabulary=False)],
            self.engine_config)
        self.generator = Engine(specs[0], self.engine_config, loaded=loaded[0],
                                num_blocks=self.plan.generator_blocks, executor=self.pipeline.executor(GENERATOR))
        self.prm = Engine(specs[1], self.engine_config, loaded=loaded[1], num_blocks=self.plan.prm_blocks,
                          executor=self.pipeline.executor(PRM))

    def _start_vllm(self, specs: tuple[ModelSpec, ModelSpec], loaded: tuple[LoadedModel, LoadedModel]) -> None:
        """Both models on vLLM engines, each with the KV bytes the memory plan gave it."""
        block = self.engine_config.cache.block_size
        blocks = (self.plan.generator_blocks, self.plan.prm_blocks)
        self.generator, self.prm = (
            VllmEngine(spec, self.engine_config, loaded=model,
                       kv_cache_bytes=count * bytes_per_block(model.arch, block, model.dtype))
            for spec, model, count in zip(specs, loaded, blocks))

    def _start_overlapped(self, specs: tuple[ModelSpec, ModelSpec], loaded: tuple[LoadedModel, LoadedModel],
                          device: torch.device) -> None:
        """pp 1 with overlap: each engine's forward on a CUDA stream of its own, or on CPU in a
        worker process of its own with its share of the cores."""
        blocks = (self.plan.generator_blocks, self.plan.prm_blocks)
        if device.type == "cuda":
            executors = [StreamExecutor(build_local_executor(model, self.engine_config, count), device)
                         for model, count in zip(loaded, blocks)]
        else:
            threads = worker_threads(self.engine_config)
            models = (StageModel.of(GENERATOR, loaded[0], blocks[0]),
                      StageModel.of(PRM, loaded[1], blocks[1], samples_full_vocabulary=False))
            try:
                for model in models:
                    self.workers.append(worker_group(model, self.engine_config, threads))
            except BaseException:
                for group in self.workers:
                    group.shutdown()
                raise
            executors = [group.executor(model.key) for group, model in zip(self.workers, models)]
        self.generator, self.prm = (Engine(spec, self.engine_config, loaded=model, num_blocks=count, executor=executor)
                                    for spec, model, count, executor in zip(specs, loaded, blocks, executors))

    def _shared_kv(self, member: str, loaded: LoadedModel, dtype: torch.dtype) -> KVAllocation:
        layout = self.plan.chunks
        caches = shared_kv_views(self.pool.buffer, loaded.arch, layout.num_blocks(member),
                                 self.engine_config.cache.block_size, layout.members[member].block_stride, dtype)
        return KVAllocation(caches, layout.num_blocks(member), self.pool.usable_blocks(member))

    @property
    def engines(self) -> dict[str, Engine]:
        return {GENERATOR: self.generator, PRM: self.prm}

    # -- async API -------------------------------------------------------------------
    def submit_generate(self, prompt: list[int], params: SamplingParams) -> asyncio.Future:
        return self._submit(self.generator, "g", prompt, params)

    def submit_score(self, prompt: list[int], params: ScoreParams) -> asyncio.Future:
        return self._submit(self.prm, "p", prompt, params)

    def _submit(self, engine: Engine, kind: str, prompt: list[int],
                params: SamplingParams | ScoreParams) -> asyncio.Future:
        request_id = f"{kind}{next(self._ids)}"
        engine.add_request(request_id, prompt, params)
        future = asyncio.get_running_loop().create_future()
        self._pending[(kind, request_id)] = future
        return future

    def abort(self, future: asyncio.Future) -> int:
        """Drop a submitted request (its future is cancelled, its blocks freed); returns the
        tokens it had generated."""
        for (kind, request_id), pending in self._pending.items():
            if pending is future:
                del self._pending[(kind, request_id)]
                future.cancel()
                return (self.generator if kind == "g" else self.prm).abort_request(request_id)
        return 0

    async def generate(self, prompt: list[int], params: SamplingParams) -> RequestOutput:
        return await self.submit_generate(prompt, params)

    async def score(self, prompt: list[int], params: ScoreParams) -> RequestOutput:
        return await self.submit_score(prompt, params)

    def step(self) -> int:
        """One step of the engines the phase policy picks among those that have work (and,
        under elastic, the memory to run): each steps in turn, or, overlapped, both launch and
        the first result to arrive is completed. Resolves finished futures."""
        return self.finish_step(self.begin_step(self.choose_step()))

    def choose_step(self) -> list[str]:
        """The engines of this step."""
        runnable = {name for name, engine in self.engines.items() if engine.has_unfinished_requests()}
        if self.elastic is not None and runnable:
            runnable = self.elastic.rebalance(self._pressures(), self.num_steps, self._yielders())
            if not runnable:
                raise RuntimeError("elastic memory left no engine able to step")
        return self.phases.choose(runnable, self.engines)

    def begin_step(self, chosen: list[str]) -> list[str]:
        """With hide_driver, launch the chosen engines' forwards now (their `step`, or the
        overlap stepper, then launches what the searches woken meanwhile added, and collects)."""
        if self.overlap is not None:
            if self.cohost.hide_driver:
                self.overlap.fill(chosen)
            return chosen
        for name in chosen:
            self._note_forward(name)
            if self.cohost.hide_driver:
                self.engines[name].launch()
        return chosen

    def finish_step(self, chosen: list[str]) -> int:
        """Complete the chosen engines' forwards; resolves finished futures."""
        if self.overlap is not None:
            for group in self.workers:  # a dead worker ends the run now, not when its engine is next due
                group.check()
            stepped = self.overlap.step(chosen)
        else:
            stepped = [(name, self.engines[name].step()) for name in chosen]
        resolved = 0
        for name, outputs in stepped:
            kind = "g" if name == GENERATOR else "p"
            for output in outputs:
                future = self._pending.pop((kind, output.request_id))
                if not future.cancelled():
                    future.set_result(output)
                resolved += 1
        self.num_steps += 1
        for name, tracker in self.trackers.items():
            counts = self.engines[name].block_counts()
            tracker.record_step(self.num_steps, counts.in_use, counts.cached_free, counts.free - counts.cached_free)
        return resolved

    def _note_forward(self, name: str) -> None:
        """A phase transition is a forward of the other engine than the last one."""
        if self._last_forward is not None and name != self._last_forward:
            self.transitions += 1
        self._last_forward = name

    def cohost_counters(self) -> CohostCounters | None:
        """Transitions and per-engine forwards, batch sizes, busy time so far (None on vLLM,
        whose engines report no microbatches)."""
        if self.backend == "vllm":
            return None
        return CohostCounters(self.transitions, self.device_busy.seconds, EngineCounters.read(self.generator),
                              EngineCounters.read(self.prm))

    def _pressure(self, name: str) -> Pressure:
        engine = self.engines[name].pressure()  # shallow: its waiting count is taken when read
        return Pressure(**{f.name: getattr(engine, f.name) for f in fields(engine)},
                        thrash_events=self.trackers[name].thrash_events)

    def _pressures(self) -> dict[str, Pressure]:
        return {name: self._pressure(name) for name in self.engines}

    def _yielders(self) -> dict:
        def yielder(name: str):
            def run() -> Pressure:
                self.engines[name].yield_memory()
                return self._pressure(name)
            return run
        return {name: yielder(name) for name in self.engines}

    @property
    def busy(self) -> bool:
        return self.generator.has_unfinished_requests() or self.prm.has_unfinished_requests()

    async def drive(self, until: asyncio.Future | asyncio.Task) -> None:
        """Step the engines whenever every coroutine is waiting on them, until `until` is done."""
        with frozen_heap(self.cohost.freeze_heap):
            await self._drive(until)

    async def _drive(self, until: asyncio.Future | asyncio.Task) -> None:
        while not until.done():
            if self.cohost.hide_driver and self.busy:
                chosen = self.choose_step()
                if PRM in chosen:  # a PRM forward waits for every score request: it is few and wide
                    for _ in range(3):
                        await asyncio.sleep(0)
                self.begin_step(chosen)
                for _ in range(3):  # the woken searches run while the forwards do
                    await asyncio.sleep(0)
                self.finish_step(chosen)
                continue
            # Let every woken coroutine enqueue its next requests before the next step.
            for _ in range(3):
                await asyncio.sleep(0)
            if until.done():
                break
            if self.busy:
                self.step()
            else:
                await asyncio.sleep(0)

    def stats(self) -> RuntimeStats:
        return RuntimeStats(self.generator.stats.as_dict(), self.prm.stats.as_dict())

    def memory_metrics(self) -> dict:
        """The memory plan, per-model prefix-cache and thrash statistics, preemptions, the
        per-step block timeline, and (elastic) every chunk move: for metrics.json."""
        models = {name: engine.memory_report() for name, engine in self.engines.items() if name not in self.trackers}
        for name, tracker in self.trackers.items():
            engine = self.engines[name]
            timeline = tracker.timeline
            pressure = engine.pressure()
            totals = [u + c + f for u, c, f in zip(timeline.in_use, timeline.cached, timeline.free)]
            models[name] = {
                **tracker.summary(),
                "preemptions": pressure.preemptions,
                "admission_stalls": pressure.admission_stalls,
                "blocks": {"start": getattr(self.plan, f"{name}_blocks"), "end": pressure.owned_blocks,
                           "min": min(totals, default=0), "max": max(totals, default=0),
                           "mean": sum(totals) / len(totals) if totals else 0.0},
                "peak_blocks_in_use": max(timeline.in_use, default=0),
                "timeline": timeline.to_dict(),
            }
        return {
            "plan": self.plan.to_dict(), "steps": self.num_steps, "backend": self.backend, **models,
            "elastic": None if self.pool is None else {
                "moves": [asdict(move) for move in self.pool.moves],
                "chunks_moved": sum(len(move.chunks) for move in self.pool.moves),
            },
        }

    def shutdown(self) -> None:
        self.generator.shutdown()
        self.prm.shutdown()
        for group in ([self.pipeline] if self.pipeline is not None else []) + self.workers:
            group.shutdown()
