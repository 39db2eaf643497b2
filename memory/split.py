"""Joint memory split: how one device budget becomes KV blocks for the generator and the PRM."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tts_runtime.config import ConfigError

GiB = 1 << 30
DEFAULT_CPU_BUDGET = 8 * GiB


@dataclass(frozen=True)
class MemoryConfig:
    device_memory: int | None = None  # bytes; None: NVML total on GPU, 8 GiB on CPU
    utilization: float = 0.9
    policy: str = "static"
    prm_fraction: float = 0.3  # share of the KV budget given to the PRM (static)

    def __post_init__(self) -> None:
        if not 0 < self.prm_fraction < 1:
            raise ConfigError(f"memory split must be in (0, 1), got {self.prm_fraction}")
        if not 0 < self.utilization <= 1:
            raise ConfigError(f"memory utilisation must be in (0, 1], got {self.utilization}")


@dataclass(frozen=True)
class MemoryPlan:
    budget_bytes: int
    weights_bytes: int
    kv_bytes: int
    generator_blocks: int
    prm_blocks: int
    prm_fraction: float


def _weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _block_bytes(loaded, block_size: int) -> int:
    element = next(loaded.model.parameters()).element_size()
    return block_size * loaded.arch.kv_bytes_per_token(element)


def plan_memory(config: MemoryConfig, generator, prm, engine_config, device: torch.device) -> MemoryPlan:
    budget = config.device_memory or DEFAULT_CPU_BUDGET
    usable = int(budget * config.utilization)
    weights = _weight_bytes(generator.model) + _weight_bytes(prm.model)
    kv = usable - weights
    block_size = engine_config.cache.block_size
    if kv <= 0:
        raise ConfigError(f"device memory budget {budget / GiB:.2f} GiB is below the models' weights "
                          f"({weights / GiB:.2f} GiB at utilisation {config.utilization}); raise --device-memory")
    prm_blocks = int(kv * config.prm_fraction) // _block_bytes(prm, block_size)
    gen_blocks = int(kv * (1 - config.prm_fraction)) // _block_bytes(generator, block_size)
    return MemoryPlan(budget, weights, kv, gen_blocks, prm_blocks, config.prm_fraction)
