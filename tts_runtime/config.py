"""Configuration dataclasses shared by the engine, the runtime and the CLI."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

import torch

import tts_runtime.cpu_features as cpu_features
from tts_runtime.options import ConfigError, comma_list, option, parse_size


@dataclass(frozen=True)
class ModelSpec:
    """Which model to load: an alias (`tts models list`), an HF folder, a `.gguf` file,
    or `dummy:<builtin-config>` for random weights of a known shape."""

    model: str
    dtype: str = "auto"  # "auto", "float32", "bfloat16", "float16"
    # Branch, tag or commit of a Hugging Face Hub model (the same as `model@revision`).
    revision: str | None = None

    def __post_init__(self) -> None:
        # Folded into the name the registry resolves (`org/name@revision`), so loading, PRM
        # detection and the run record all see the one pinned spelling.
        if self.revision is None:
            return
        name, at, pinned = self.model.partition("@")
        if not self.revision.strip():
            raise ConfigError(f"--revision for {self.model} is empty; name a branch, tag or commit, or drop it")
        if at and pinned != self.revision:
            raise ConfigError(f"model {self.model} pins revision '{pinned}' but --revision is '{self.revision}'; "
                              "give the revision once")
        object.__setattr__(self, "model", f"{name}@{self.revision}")


MAX_BLOCK_SIZE = 256


@dataclass(frozen=True)
class CacheConfig:
    # Only full blocks enter the prefix cache, so a request that continues a cached sequence
    # recomputes the cached one's last partial block: on average half a block per PRM
    # request and per generator step of a search. None: default_block_size(device).
    block_size: int | None = option(None, "Tokens per KV block (default: 8 on a CPU, 16 on a GPU); the prefix "
                                    "cache shares whole blocks only, so smaller blocks recompute less of each "
                                    "continued prompt.", panel="Engine")
    # A search continues each beam from the sequence that generated it: keeping that
    # sequence's partial last block (and copying a forking prompt's to each child) spares the
    # recompute of up to block_size - 1 tokens per step and request (block_manager.py).
    reuse_partial_blocks: bool = option(True, "Keep a finished sequence's partial last KV block for the request "
                                        "that continues it, and copy a forking prompt's to its children, instead "
                                        "of recomputing those tokens (needs the prefix cache for the first).",
                                        panel="Engine", flag="partial_blocks")
    # Exactly one of these decides the pool size; num_blocks wins when both are set.
    num_blocks: int | None = None
    kv_cache_bytes: int | None = None
    enable_prefix_caching: bool = option(True, "Reuse the KV of prompt prefixes already in the cache.",
                                         panel="Engine", flag="prefix_caching")
    # Host KV tier (Seesaw): bytes of host memory per engine that keep the prefix blocks
    # its device pool evicts, swapped back in on a later hit instead of recomputed (0: off).
    host_kv_bytes: int = option(0, "Host KV tier per model, e.g. 2GiB: evicted prefix blocks wait there and are "
                                "swapped back in instead of recomputed (0: off).", panel="Engine",
                                flag="host_kv_memory", parse=parse_size)
    # Swap in the tier's blocks of the waiting requests the next step will admit, one step
    # ahead (behind the forward on CUDA; synchronously between steps on CPU).
    host_kv_prefetch: bool = option(True, "Host KV tier: swap in the blocks of requests about to be admitted one "
                                    "step ahead.", panel="Engine")
    # Writing zeros over a CPU KV cache at start made the main job hold all of it (8.3 GiB
    # resident instead of 3.0) and start 1.2 s later; the kernel's zeroed pages cost only
    # where a run writes (executor/kv_cache.py, docs/benchmarks/lazy_kv.md).
    lazy_kv_zeroing: bool = option(True, "CPU: take the KV cache as zeroed pages the kernel hands out when first "
                                   "written, instead of writing zeros over all of it at start.", panel="Engine")

    def __post_init__(self) -> None:
        if self.block_size is not None and not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ConfigError(f"--block-size must be between 1 and {MAX_BLOCK_SIZE} tokens, got {self.block_size}")
        if self.host_kv_bytes < 0:
            raise ConfigError(f"--host-kv-memory must be >= 0 (0 turns the host KV tier off), got {self.host_kv_bytes}")


@dataclass(frozen=True)
class ThrottleConfig:
    """gLLM token throttling (the `throttle` scheduler policy); defaults are the paper's.

    Prefill tokens per microbatch: min(max(waiting / iterations, min_prefill),
    max_prefill * max((kv_free - kv_threshold) / (1 - kv_threshold), 0))."""

    iterations: int = option(8, "throttle #T: spread the waiting prefill over this many microbatches.",
                             panel="Scheduler", flag="throttle_iterations")
    max_prefill: int = option(2048, "throttle #MaxP.", panel="Scheduler", flag="throttle_max_prefill")
    min_prefill: int = option(32, "throttle #MinP: floors the waiting-tokens term only.", panel="Scheduler",
                              flag="throttle_min_prefill")
    kv_threshold: float = option(0.05, "throttle θ: no prefill while the free KV fraction is below this.",
                                 panel="Scheduler", flag="throttle_kv_threshold")

    def __post_init__(self) -> None:
        checks = [
            (self.iterations >= 1, f"iterations must be >= 1, got {self.iterations}"),
            (self.max_prefill >= 1, f"max prefill must be >= 1, got {self.max_prefill}"),
            (0 <= self.min_prefill <= self.max_prefill,
             f"min prefill must be in [0, max prefill={self.max_prefill}], got {self.min_prefill}"),
            (0 <= self.kv_threshold < 1, f"kv threshold must be in [0, 1), got {self.kv_threshold}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(f"invalid throttle setting: {message}")


SCHEDULER_POLICIES = ("sarathi", "throttle")


@dataclass(frozen=True)
class SchedulerConfig:
    policy: str = option("sarathi", "sarathi (fill the token budget) or throttle (gLLM token throttling).",
                         panel="Scheduler", flag="scheduler_policy")
    max_num_batched_tokens: int = option(2048, "Tokens per engine step (the token budget).", panel="Scheduler")
    max_num_seqs: int = option(256, "Sequences per engine step.", panel="Scheduler")
    # Largest prefill chunk for one sequence in one step (None: the token budget).
    max_prefill_chunk: int | None = option(None, "Largest prefill chunk of one sequence in one step (default: "
                                           "the token budget).", panel="Scheduler")
    throttle: ThrottleConfig = field(default_factory=ThrottleConfig)
    # FastTTS prefix-aware ordering: admit waiting requests that share leading prefix blocks
    # one after another (first-come order between groups), so their prefix stays hot.
    prefix_aware_order: bool = option(False, "Admit waiting requests that share a prefix together (FastTTS).",
                                      panel="Scheduler")
    # Schedule and build step N+1 while step N runs: a decode in flight is scheduled again,
    # its input a placeholder the executor fills from step N's sampled token. Only executors
    # that sample on the device side can fill it (the simulated device, and the local executor
    # with --executor-sampling); with the others the engine stays synchronous whatever this says.
    async_scheduling: bool = option(True, "Schedule and build the next step while the current one runs "
                                    "(executors that sample on the device: --device sim, --executor-sampling).",
                                    panel="Scheduler")

    def __post_init__(self) -> None:
        if self.policy not in SCHEDULER_POLICIES:
            raise ConfigError(f"unknown scheduler policy '{self.policy}'; choose {' or '.join(SCHEDULER_POLICIES)}")
        if self.max_num_batched_tokens < 1:
            raise ConfigError(f"the token budget per step must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_num_seqs < 1:
            raise ConfigError(f"the sequence cap per step must be >= 1, got {self.max_num_seqs}")
        if self.max_prefill_chunk is not None and self.max_prefill_chunk < 1:
            raise ConfigError(f"the prefill chunk must be >= 1 token, got {self.max_prefill_chunk}")


@dataclass(frozen=True)
class ParallelConfig:
    """Pipeline parallelism: `pp_size` stage processes, each running a contiguous slice of
    every model's layers. The SiPipe switches (on by default) are measured by `tts bench pipeline`."""

    pp_size: int = option(1, "Pipeline stages (processes), each running a slice of both models' layers.",
                          panel="Pipeline", flag="pp")
    pp_layers: tuple[int, ...] | None = option(None, "Generator layers per stage, e.g. 16,14 (default: balanced "
                                               "on measured time).", panel="Pipeline",
                                               parse=comma_list(int, "pp-layers"))
    # Activations between stages: "shm" (shared-memory slots; through host memory for GPU
    # stages), "gloo" or "nccl" (torch.distributed point-to-point); auto: nccl when every
    # stage has a GPU of its own, else shm (executor/pipeline/stage_placement.py).
    transport: str = option("auto", "Activations between stages: shm (shared memory), gloo or nccl "
                            "(torch.distributed); auto: nccl when every stage has a GPU of its own, else shm.",
                            panel="Pipeline", flag="pp_transport")
    threads_per_stage: int | None = option(None, "Torch threads per stage (default: cores / pp).",
                                           panel="Pipeline")
    # SiPipe: the last stage returns logits rows and the driver samples them while the
    # stages run the next microbatch (off: the last stage samples and returns tokens).
    sample_on_driver: bool = option(True, "SiPipe: sample on the driver while the stages run on.",
                                    panel="Pipeline")
    # SiPipe: a stage prepares microbatch i+1's inputs (into the input buffers of i+1's
    # parity) while microbatch i computes (off: it prepares them after i).
    token_safe: bool = option(True, "SiPipe: prepare the next microbatch's inputs while one computes.",
                              panel="Pipeline")
    # SiPipe: receivers size activation buffers from the schedule they already hold and
    # get only a ready signal (off: every activation travels with its shape as a message).
    structure_aware: bool = option(True, "SiPipe: activations through pre-sized shared-memory slots, no shape "
                                   "messages.", panel="Pipeline")

    def __post_init__(self) -> None:
        if self.pp_size < 1:
            raise ConfigError(f"--pp must be >= 1, got {self.pp_size}")
        if self.pp_layers is not None and (len(self.pp_layers) != self.pp_size or min(self.pp_layers) < 1):
            raise ConfigError(f"--pp-layers needs {self.pp_size} positive layer counts (one per stage), "
                              f"got {','.join(map(str, self.pp_layers))}")
        if self.transport not in ("auto", "shm", "gloo", "nccl"):
            raise ConfigError(f"pipeline transport '{self.transport}' is not available; choose auto, shm "
                              "(shared memory), gloo or nccl (torch.distributed)")
        if self.threads_per_stage is not None and self.threads_per_stage < 1:
            raise ConfigError(f"--threads-per-stage must be >= 1, got {self.threads_per_stage}")


PHASE_POLICIES = ("auto", "alternate", "batched")


@dataclass(frozen=True)
class CohostConfig:
    """How the runtime drives its co-hosted generator and PRM (tts_runtime/cohost/phases.py,
    tts_runtime/cohost/overlap.py); measured by `tts bench cohost`.

    `alternate` steps each engine that has work once per runtime step. `batched` (Seesaw's
    transition-minimising rule) keeps stepping one engine across all in-flight problems:
    the generator until its unfinished sequences fall to `generator_low_water` or the PRM's
    uncached pending tokens reach `prm_buffer_tokens`; then the PRM until it is drained or
    the generator's unfinished sequences reach `generator_buffer_seqs`. `overlap` runs the
    two engines' forwards at the same time (CPU: a worker process each; CUDA: a stream each; the
    simulated device: both queued on its one stream, the generator's behind the PRM's);
    with both, the generator decodes in every step and the phases only batch the PRM.
    `auto` is batched on a GPU and alternate elsewhere (`resolve_phase_policy`)."""

    phase_policy: str = option("auto", "auto (batched on a GPU, alternate on CPU), alternate (each engine every "
                               "step) or batched (Seesaw: long generator and PRM phases).", panel="Co-hosting")
    prm_buffer_tokens: int = option(2048, "batched: switch to the PRM once this many uncached tokens wait for it.",
                                    panel="Co-hosting")
    # 4, not 0 (waiting for the generator to run dry): the PRM's forward then runs while the
    # generator's last few sequences finish, and those join the next step's requests in shared
    # forwards instead of decoding alone; 4% fewer device seconds, 1.01-1.09x problems/min on the
    # simulated H100 (docs/benchmarks/host_low_water.md).
    generator_low_water: int = option(4, "batched: switch to the PRM once the generator has this few unfinished "
                                      "sequences (0: once it runs dry).", panel="Co-hosting")
    generator_buffer_seqs: int = option(256, "batched: back to the generator once this many sequences wait for "
                                        "it.", panel="Co-hosting")
    overlap: bool = option(False, "Run the generator's and the PRM's forwards at the same time (a worker process "
                           "each on CPU, a CUDA stream each on GPU; on --device sim, queued on its one stream).",
                           panel="Co-hosting")
    # Launch each step's forwards before the searches woken by the last step run, so their
    # host work (search logic, score cache, grading) hides behind the device; their new
    # requests join the step after (docs/benchmarks/host.md).
    hide_driver: bool = option(False, "Launch each step's forwards before the search logic of the last step runs, "
                               "hiding it behind the device.", panel="Co-hosting")
    # A full garbage collection walked every object of the models, tokenizers and engines:
    # pauses of 0.25-0.6 s with the device idle (cohost/gc_freeze.py).
    freeze_heap: bool = option(True, "Freeze the heap while the search runs (gc.freeze): Python's full garbage "
                               "collections skip the objects alive at its start.", panel="Co-hosting")

    def __post_init__(self) -> None:
        if self.phase_policy not in PHASE_POLICIES:
            raise ConfigError(f"unknown phase policy '{self.phase_policy}'; choose "
                              f"{', '.join(PHASE_POLICIES[:-1])} or {PHASE_POLICIES[-1]}")
        for name in ("prm_buffer_tokens", "generator_buffer_seqs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.generator_low_water < 0:
            raise ConfigError(f"--generator-low-water must be >= 0, got {self.generator_low_water}")


LINEAR_BACKENDS = ("auto", "streamed", "prepacked", "onednn", "torch")
ATTENTION_BACKENDS = ("auto", "cpu", "torch", "triton")


@dataclass(frozen=True)
class EngineConfig:
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    # Runtime level: how the co-hosted pair is stepped (an engine alone ignores it).
    cohost: CohostConfig = field(default_factory=CohostConfig)
    device: str = option("auto", "auto, cpu, cuda, cuda:1 ..., or sim (sim:COSTS.json): a simulated device for "
                         "host-overhead benchmarks.")
    attention_backend: str = option("auto", "auto (the C++ kernel on CPU, triton on CUDA), cpu, torch or triton.",
                                    panel="Kernels")
    seed: int = 0
    # Torch backend: run decodes in groups of similar context length rather than padding
    # the whole batch to its longest context.
    group_decodes_by_length: bool = option(True, "torch attention backend: decode in groups of similar context "
                                           "length instead of padding to the longest.", panel="Kernels")
    # Sequences whose block tables share leading blocks attend to those blocks once, as one
    # batch of queries, and to their own blocks separately (cascade attention). None: the
    # backend's default: on in the cpu kernel (measured), off in triton (not yet measured on
    # a GPU).
    cascade_attention: bool | None = option(None, "Shared-prefix (cascade) attention (default: on in the cpu "
                                            "backend, off in triton).", panel="Kernels", flag="cascade")
    # CPU kernel on a bf16 cache: query x key and weight x value dot products two elements at
    # a time on AVX512-BF16 (vdpbf16ps) where the CPU has it, and the softmax weights (rounded
    # to bf16 for the value sum) from a coarser exp; off: each element converted to fp32
    # first, the exact exp.
    attention_bf16_dot: bool = option(True, "cpu backend, bf16 models: dot products on AVX512-BF16 where the CPU "
                                      "has it, and a coarser softmax exp.", panel="Kernels")
    # CPU kernel: lane groups of at most 4 query vectors (a decode row of a small GQA group)
    # take their scores along head_dim, each key row loaded once for all of them, instead of
    # broadcasting every key element across a vector's mostly idle lanes, and their value
    # sums broadcast each weight once for several chunks of head_dim; off: the lane loops.
    attention_few_lanes: bool = option(True, "cpu backend: groups of at most 4 query vectors take scores "
                                       "along head_dim and value sums of their own.", panel="Kernels")
    # The projections and the output layer on the CPU: "onednn" (oneDNN's JIT matmul, which
    # uses AVX-512 on AMD and Intel alike), "prepacked" (the same on weights reordered once
    # into oneDNN's blocked layout: a packed copy beside the module's, counted in the memory
    # profile), "streamed" (weights packed once into one sequential stream for tts's kernels:
    # bf16 on AVX512-BF16, executor/cpu/cpu_linear.py; fp32 on AVX2 and FMA,
    # cpu_linear_fp32.py; what they do not take as prepacked), "torch" (F.linear: MKL's sgemm
    # for fp32, which takes a slower path on AMD CPUs), "auto" (streamed where it measured
    # faster: bf16 with AVX512-BF16, fp32 with AVX2 but no AVX-512; onednn elsewhere; see
    # layer_ops.auto_streams). GPUs use cuBLAS.
    linear_backend: str = option("auto", "CPU projections and output layer: auto (tts's streamed kernels where "
                                 "they win: bf16 models with AVX512-BF16, fp32 models with AVX2 and no AVX-512; "
                                 "onednn elsewhere), onednn, prepacked (oneDNN on weights reordered once: a packed "
                                 "copy in the memory budget), streamed (tts's kernels on weights packed once into "
                                 "one stream: bf16 on AVX512-BF16, fp32 on AVX2), or torch (F.linear).",
                                 panel="Kernels")
    # The last layer past attention (output projection, MLP, final norm) only on the rows
    # whose logits are read: a PRM chunk's label positions, a prompt's last token. Every row's
    # K/V is still stored. Off: every row, as HF runs it.
    prune_last_layer: bool = option(True, "Run the last layer's output projection and MLP only on the rows whose "
                                    "logits are read (PRM label positions, a prompt's last token).",
                                    panel="Kernels")
    # CPU: RMSNorm, rotary embedding and the gated activation as one C++ pass each
    # (executor/cpu/cpu_layer_ops.py), rounding where torch's eager ops round; off: the eager ops,
    # bit-exact with HF.
    cpu_fused_ops: bool = option(True, "CPU: RMSNorm, rotary embedding and the gated activation as one C++ pass "
                                 "each (off: torch's eager ops, bit-exact with HF).", panel="Kernels")
    # GPU execution switches, honoured on CUDA only (the CPU has cpu_fused_ops):
    # replay decode steps from CUDA graphs captured at padded batch sizes (triton backend),
    # and run RMSNorm, rotary embedding and the gated activation as fused Triton kernels.
    cuda_graphs: bool = option(True, "CUDA: replay decode steps from captured graphs.", panel="Kernels")
    score_graphs: bool = option(True, "CUDA: replay score-only forwards (the PRM's) from graphs captured per "
                                "padded token count.", panel="Kernels")
    executor_sampling: bool = option(False, "Sample on the device side of the executor, so that async scheduling "
                                     "launches step N+1 before step N's tokens reach the host (for CUDA; off until "
                                     "measured on a GPU).", panel="Scheduler")
    compile: bool = option(True, "CUDA: fused Triton kernels for RMSNorm, rotary embedding and the gated "
                           "activation.", panel="Kernels", flag="fused_cuda_ops")
    linear_bf16_weights: bool = option(False, "--linear-backend streamed on fp32 models (the AVX2/FMA kernel): "
                                       "store the packed weights as bf16, widened in registers: half the bytes "
                                       "per decode step, at bf16 precision for the weights.", panel="Kernels")

    def __post_init__(self) -> None:
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"unknown attention backend '{self.attention_backend}'; choose "
                              f"{', '.join(ATTENTION_BACKENDS)}")
        if self.linear_backend not in LINEAR_BACKENDS:
            raise ConfigError(f"unknown --linear-backend '{self.linear_backend}'; choose one of "
                              f"{', '.join(LINEAR_BACKENDS)}")
        if self.cache.block_size is None:
            object.__setattr__(self, "cache", replace(self.cache, block_size=default_block_size(self.device)))
        if self.cache.host_kv_bytes and self.parallel.pp_size > 1:
            raise ConfigError("--host-kv-memory needs --pp 1: the host KV tier copies blocks in the driver's "
                              "process, and pipeline stages hold the KV; drop one of the two")
        if self.executor_sampling and (self.parallel.pp_size > 1 or self.cohost.overlap):
            raise ConfigError("--executor-sampling samples in the driver's local executor; --pp and --overlap run "
                              "the forwards elsewhere (a pipeline's last stage samples with --no-sample-on-driver): "
                              "drop one of the two")


def default_block_size(device: str) -> int:
    """8 tokens on a CPU, where a search's recomputed partial blocks are compute (beam search
    at search-and-learn's settings: 1.10x per generated token against 16, the attention
    kernel as fast per token; docs/benchmarks/block_size.md); 16 on a GPU and the simulated
    one, not yet measured there, where each extra block is host work."""
    on_cpu = device == "cpu" or device.startswith("cpu:") or (device == "auto" and not torch.cuda.is_available())
    return 8 if on_cpu else 16


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "sim" or device.startswith("sim:"):  # a simulated device: the host side is the CPU's
        costs = device[len("sim:"):]
        if device.startswith("sim:") and not os.path.isfile(costs):
            what = "is not a file" if os.path.exists(costs) else "does not exist"
            raise ConfigError(f"--device {device}: the cost file '{costs}' {what}; pass sim for the H100 defaults or "
                              "sim:FILE with a fit written by `tts bench cohost` on a real device")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"unknown device '{device}'; choose auto, cpu, cuda (cuda:N for GPU N) or sim") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError(f"device '{device}' is not supported; choose auto, cpu, cuda (cuda:N for GPU N) or sim")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device '{device}' requested but CUDA is not available; use --device cpu")
    return dev


_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def resolve_phase_policy(policy: str, device: torch.device, backend: str = "native") -> str:
    """`auto` is what measured faster there (docs/benchmarks/cohost_gpu.md, cohost.md): on a
    GPU a PRM forward costs about the same for a few beams as for many (H100: 14 ms fixed,
    batched 1.34x alternate), on a CPU a forward's cost grows with its width and batching
    starves the generator's batches (2 cores: 0.88x). vLLM engines step whole: alternate."""
    if policy != "auto":
        return policy
    return "batched" if device.type == "cuda" and backend == "native" else "alternate"


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto` is bf16 on a GPU and on a CPU with AVX512-BF16 (there bf16 dot products run at
    twice fp32's rate on half the bytes), fp32 on other CPUs, which run bf16 slower than fp32.
    fp32 stays the parity reference: pass float32 to compare with HF transformers."""
    if dtype == "auto":
        try:
            return torch.bfloat16 if device.type == "cuda" or cpu_features.has("avx512_bf16") else torch.float32
        except cpu_features.CpuFeaturesError as exc:
            raise ConfigError(str(exc)) from None
    if dtype not in _DTYPES:
        raise ConfigError(f"unknown dtype '{dtype}'; choose one of auto, {', '.join(sorted(_DTYPES))}")
    return _DTYPES[dtype]
