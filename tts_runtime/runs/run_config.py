"""The run configuration: one frozen object for everything a `tts` run takes.

Its parts are the layers' own config dataclasses (search, dataset, models, memory, engine,
scale-out); their fields carry the option declarations (tts_runtime/options.py) the CLI is
built from, so each default is written once, on its field. `validate()` holds every check
that spans parts; each part checks its own fields when built. A run folder's `config.json`
holds `to_dict()`, and `--config` reads the same keys back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memory.split import MemoryConfig, check_budget_within
from search.config import SearchConfig
from tts_runtime.cohost.runtime import check_backend, check_cohost, check_host_tier, check_parallel
from tts_runtime.config import ConfigError, EngineConfig, ModelSpec, resolve_device, resolve_dtype
from tts_runtime.executor.device_memory import device_memory_info
from tts_runtime.executor.sim import is_sim_device, sim_costs_for
from tts_runtime.models.registry import DEFAULT_GENERATOR, DEFAULT_PRM
from tts_runtime.options import option, option_fields, option_values
from tts_runtime.runs.datasets import DatasetConfig
from tts_runtime.runs.scale_config import ScaleOut


@dataclass(frozen=True)
class ModelsConfig:
    generator: str = option(DEFAULT_GENERATOR, "Generator: alias (tts models list), Hub id (org/name or org/name@revision), "
                            "HF folder or .gguf.")
    prm: str = option(DEFAULT_PRM, "PRM: alias, Hub id, HF folder or .gguf.")
    generator_revision: str | None = option(None, "Branch, tag or commit of a Hub generator (the same as "
                                            "--generator org/name@revision).", panel="Models")
    prm_revision: str | None = option(None, "Branch, tag or commit of a Hub PRM.", panel="Models")
    dtype: str = option("auto", "Both models' weights and activations: auto (bf16 on a GPU and on a CPU with "
                        "AVX512-BF16, else fp32), float32 (the parity reference), bfloat16 or float16.",
                        panel="Models")

    def specs(self) -> tuple[ModelSpec, ModelSpec]:
        return (ModelSpec(self.generator, self.dtype, self.generator_revision),
                ModelSpec(self.prm, self.dtype, self.prm_revision))


@dataclass(frozen=True)
class ScaleOutConfig:
    replicas: int | None = option(None, "Run N runtime replicas as Ray actors (one per GPU; on CPU "
                                  "--threads-per-replica each).", panel="Scale-out (Ray)")
    ray_address: str | None = option(None, "Join this Ray cluster (default: a local one started for the run).",
                                     panel="Scale-out (Ray)")
    threads_per_replica: int = option(1, "Torch threads (and Ray CPUs) per replica.", panel="Scale-out (Ray)")
    hang_timeout_s: float = option(300.0, "Seconds a busy replica may leave a heartbeat unanswered before it is "
                                   "taken as hung, killed and replaced.", panel="Scale-out (Ray)")

    def scale_out(self, device: str) -> ScaleOut | None:
        """None: search in this process; else how to spread the run over Ray."""
        if self.replicas is None and self.ray_address is None:
            return None
        gpus = 1 if resolve_device(device).type == "cuda" else 0
        return ScaleOut(replicas=1 if self.replicas is None else self.replicas, address=self.ray_address,
                        threads_per_replica=self.threads_per_replica, gpus_per_replica=gpus,
                        hang_timeout_s=self.hang_timeout_s)


@dataclass(frozen=True)
class RunConfig:
    search: SearchConfig = field(default_factory=SearchConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    models: ModelsConfig = field(default_factory=ModelsConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    scale: ScaleOutConfig = field(default_factory=ScaleOutConfig)
    backend: str = option("native", "native (our engine) or vllm (both models on vLLM engines; needs the vllm "
                          "extra).", panel="Engine")
    out: str | None = option(None, "Run folder (default runs/<method>-<time>).")
    resume: bool = option(False, "Continue the run in --out, skipping finished problems, with the options its "
                          "last session ran with (its history.jsonl) unless given here.")

    def validate(self) -> None:
        """Every check that spans parts, each a one-line ConfigError, before anything loads."""
        if self.resume and self.out is None:
            raise ConfigError("--resume needs --out: the run folder to continue")
        device = resolve_device(self.engine.device)
        resolve_dtype(self.models.dtype, device)
        # Before loading. A GPU's total is checked once the runtime holds the device, and a
        # Ray cluster's replicas run on its nodes, whose memory this machine cannot see.
        if is_sim_device(self.engine.device):
            check_budget_within(self.memory.device_memory, sim_costs_for(self.engine.device).device_memory,
                                "the simulated device")
        elif device.type == "cpu" and self.scale.ray_address is None:
            check_budget_within(self.memory.device_memory, device_memory_info(device).total, "this machine")
        if self.backend != "native" and self.scale.scale_out(self.engine.device) is not None:
            raise ConfigError("--backend vllm runs in this process; Ray replicas (--replicas, --ray-address) "
                              "serve the native engine")
        check_backend(self.backend, self.memory.policy)
        check_cohost(self.backend, self.memory.policy, self.engine.cohost)
        check_host_tier(self.engine.cache, self.backend, self.engine.cohost)
        check_parallel(self.backend, self.memory.policy, self.engine.parallel)

    def to_dict(self) -> dict[str, Any]:
        """Every option's value, nested as the parts are (config.json's layout)."""
        nested: dict[str, Any] = {}
        values = option_values(self)
        for flag, spec in option_fields(RunConfig).items():
            section = nested
            for name in spec.path[:-1]:
                section = section.setdefault(name, {})
            value = values[flag]
            section[spec.path[-1]] = list(value) if isinstance(value, tuple) else value
        return nested
