"""The joint memory split: how one device budget becomes KV blocks for the generator and the PRM.

    usable = budget x utilisation
    KV     = usable - (weights_g + weights_p + activations_g + activations_p + non-torch)
    PRM KV = floor(KV x F),  generator KV = KV - PRM KV
    blocks = KV share // block bytes  (block bytes = block_size x bytes/token/layer x layers)

Activations are summed because the two engines may run at once (on GPU, overlapped);
non-torch memory (CUDA context, workspaces) belongs to the process and counts once.

Policies choose F:
* `static`: F is given (`--memory-split`), like vLLM's per-instance memory fraction.
* `auto`: F from both profiles and the workload before the run: each model's expected
  KV demand is sequences it holds at once x tokens per sequence x its KV bytes per
  token, and F is the PRM's share of the total demand. The plan says why.
* `elastic`: the KV budget becomes one pool of chunks (memory/pool.py) that starts at
  auto's F and moves at run time (memory/elastic.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memory.pool import ChunkLayout
from memory.profile import GiB, MemoryProfile, format_bytes, size_option
from tts_runtime.config import ConfigError
from tts_runtime.options import option, parse_optional_size

POLICIES = ("static", "auto", "elastic")
DEFAULT_CPU_BUDGET = 8 * GiB
# Auto never gives either model less than this share: both must be able to run.
_AUTO_BOUNDS = (0.05, 0.95)
@dataclass(frozen=True)
class MemoryConfig:
    device_memory: int | None = option(None, "Memory budget for both models, e.g. 6GiB (default: the GPU's or "
                                       "the simulated device's, 8GiB on CPU, less where less is free).",
                                       parse=parse_optional_size)
    utilization: float = option(0.9, "Share of the budget the runtime may use.", panel="Memory",
                                flag="memory_utilization")
    policy: str = option("static", "static, auto (split from the profiles and the workload) or elastic (one KV "
                         "pool that moves at run time).", panel="Memory", flag="memory_policy")
    prm_fraction: float = option(0.3, "Share of the KV budget for the PRM (static).", flag="memory_split")

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown memory policy '{self.policy}'; choose one of {', '.join(POLICIES)}")
        if not 0 < self.prm_fraction < 1:
            raise ConfigError(f"memory split must be in (0, 1), got {self.prm_fraction}")
        if not 0 < self.utilization <= 1:
            raise ConfigError(f"memory utilisation must be in (0, 1], got {self.utilization}")
        if self.device_memory is not None and self.device_memory <= 0:
            raise ConfigError(f"device memory must be positive, got {self.device_memory}")


@dataclass(frozen=True)
class Workload:
    """Expected KV demand of a run, per model: sequences held at once x tokens per sequence."""

    generator_sequences: int
    generator_tokens: float
    prm_sequences: int
    prm_tokens: float

    @classmethod
    def beam_search(cls, beams: int, problems_in_flight: int, generator_prompt_tokens: float,
                    prm_prompt_tokens: float, steps: float, step_tokens: float) -> Workload:
        """Beam search: every in-flight problem holds `beams` beams in both models; a beam
        is its share of the (cached, shared) prompt plus its own steps."""
        own = steps * step_tokens
        return cls(beams * problems_in_flight, generator_prompt_tokens / beams + own,
                   beams * problems_in_flight, prm_prompt_tokens / beams + own)

    def demand_bytes(self, generator: MemoryProfile, prm: MemoryProfile) -> tuple[float, float]:
        return (self.generator_sequences * self.generator_tokens * generator.kv_bytes_per_token,
                self.prm_sequences * self.prm_tokens * prm.kv_bytes_per_token)


@dataclass(frozen=True)
class ModelShare:
    profile: MemoryProfile
    kv_bytes: int  # this model's KV (elastic: at start)
    blocks: int

    def to_dict(self) -> dict:
        return {"profile": self.profile.to_dict(), "kv_bytes": self.kv_bytes, "blocks": self.blocks}


@dataclass(frozen=True)
class MemoryPlan:
    policy: str
    budget_bytes: int
    utilization: float
    non_torch_bytes: int
    kv_bytes: int
    prm_fraction: float  # elastic: at start
    reason: str
    generator: ModelShare
    prm: ModelShare
    chunks: ChunkLayout | None = None  # elastic only
    prm_chunks: int = 0  # elastic: chunks the PRM owns at start (the top ones)

    @property
    def usable_bytes(self) -> int:
        return int(self.budget_bytes * self.utilization)

    @property
    def generator_blocks(self) -> int:
        return self.generator.blocks

    @property
    def prm_blocks(self) -> int:
        return self.prm.blocks

    def to_dict(self) -> dict:
        return {
            "policy": self.policy, "budget_bytes": self.budget_bytes, "utilization": self.utilization,
            "usable_bytes": self.usable_bytes, "non_torch_bytes": self.non_torch_bytes,
            "kv_bytes": self.kv_bytes, "prm_fraction": self.prm_fraction, "reason": self.reason,
            "generator": self.generator.to_dict(), "prm": self.prm.to_dict(),
            "chunks": self.chunks.to_dict() if self.chunks else None, "prm_chunks": self.prm_chunks,
        }


def kv_budget(budget: int, utilization: float, generator: MemoryProfile, prm: MemoryProfile) -> tuple[int, int]:
    """(KV bytes, non-torch bytes) left once both models' fixed memory is taken; a clear
    error, naming the minimum budget, when no KV block of each would fit."""
    non_torch = max(generator.non_torch_bytes, prm.non_torch_bytes)
    fixed = (generator.weights_bytes + prm.weights_bytes + generator.activation_bytes
             + prm.activation_bytes + non_torch)
    kv = int(budget * utilization) - fixed
    if kv < generator.block_bytes + prm.block_bytes:
        minimum = math.ceil((fixed + generator.block_bytes + prm.block_bytes) / utilization)
        raise ConfigError(
            f"device memory budget {format_bytes(budget)} is below what both models need: weights "
            f"{format_bytes(generator.weights_bytes + prm.weights_bytes)} + activations "
            f"{format_bytes(generator.activation_bytes + prm.activation_bytes)} + non-torch "
            f"{format_bytes(non_torch)} + one KV block each, at utilisation {utilization}; "
            f"the minimum is {format_bytes(minimum)} ({minimum} bytes): raise --device-memory")
    return kv, non_torch


def check_budget_within(budget: int | None, total: int | None, where: str) -> None:
    """A budget beyond all the memory `where` has (a typo's extra digits, a GPU's size on a
    smaller one) can never be planned: a one-line error, not an out-of-memory failure."""
    if budget is not None and total is not None and budget > total:
        raise ConfigError(f"--device-memory {format_bytes(budget)} is more than {where} has in all "
                          f"({format_bytes(total)}); pass a smaller --device-memory")


def cpu_budget(config: MemoryConfig, budget: int, host_available: int,
               generator: MemoryProfile, prm: MemoryProfile) -> int:
    """On CPU the "device" is this machine's memory, and the KV caches are committed as
    they fill: a budget whose KV does not fit in what is free ends in the kernel's
    out-of-memory killer minutes into a run. The default budget shrinks to fit (KV at
    most 3/4 of what is free); a budget the user set is an error naming one that fits."""
    fixed = (generator.weights_bytes + prm.weights_bytes + generator.activation_bytes
             + prm.activation_bytes + max(generator.non_torch_bytes, prm.non_torch_bytes))
    fitting = int((fixed + host_available * 3 // 4) / config.utilization)
    kv = int(budget * config.utilization) - fixed
    if config.device_memory is None:
        return min(budget, fitting)
    if kv > host_available:
        raise ConfigError(
            f"--device-memory {format_bytes(budget)} gives the KV caches {format_bytes(kv)} but this machine has "
            f"{format_bytes(host_available)} of memory free; pass --device-memory {size_option(fitting)} or less")
    return budget


def auto_fraction(generator: MemoryProfile, prm: MemoryProfile, workload: Workload | None) -> tuple[float, str]:
    """The PRM's share of the expected KV demand, and why."""
    if workload is None:
        g, p = generator.kv_bytes_per_token, prm.kv_bytes_per_token
        fraction = _clamp(p / (g + p))
        return fraction, (f"no workload given: split by KV bytes per token (PRM {p / 1024:.0f} KiB, "
                          f"generator {g / 1024:.0f} KiB) -> PRM fraction {fraction:.2f}")
    g, p = workload.demand_bytes(generator, prm)
    fraction = _clamp(p / (g + p))
    return fraction, (
        f"expected KV demand: PRM {workload.prm_sequences} sequences x {workload.prm_tokens:.0f} tokens x "
        f"{prm.kv_bytes_per_token / 1024:.0f} KiB = {format_bytes(int(p))}, generator "
        f"{workload.generator_sequences} x {workload.generator_tokens:.0f} x "
        f"{generator.kv_bytes_per_token / 1024:.0f} KiB = {format_bytes(int(g))} "
        f"-> PRM fraction {fraction:.2f}")


def _clamp(fraction: float) -> float:
    low, high = _AUTO_BOUNDS
    return min(max(fraction, low), high)


def plan_memory(config: MemoryConfig, generator: MemoryProfile, prm: MemoryProfile, *,
                device_total: int | None = None, workload: Workload | None = None,
                element_sizes: tuple[int, int] = (4, 4), host_available: int | None = None) -> MemoryPlan:
    """Blocks for each model under the configured policy. `device_total`: the device's
    memory (NVML on GPU) when `config.device_memory` is not set; `element_sizes`: KV
    element bytes of (generator, PRM), which an elastic pool's views need;
    `host_available`: on CPU, the host memory still free once the weights are loaded,
    which the KV caches must fit in (see cpu_budget)."""
    check_budget_within(config.device_memory, device_total, "the device")
    budget = config.device_memory or device_total or DEFAULT_CPU_BUDGET
    if host_available is not None:
        budget = cpu_budget(config, budget, host_available, generator, prm)
    kv, non_torch = kv_budget(budget, config.utilization, generator, prm)
    if config.policy == "static":
        fraction, reason = config.prm_fraction, f"PRM fraction {config.prm_fraction:.2f} as set"
    else:
        fraction, reason = auto_fraction(generator, prm, workload)
        if config.policy == "elastic":
            reason = (f"one pool of KV chunks, starting at PRM fraction {fraction:.2f} "
                      f"({reason}); chunks move at run time to the starved model")
    common = (config.policy, budget, config.utilization, non_torch, kv, fraction, reason)
    if config.policy == "elastic":
        return _elastic_plan(common, generator, prm, element_sizes)
    prm_kv = int(kv * fraction)
    shares = (ModelShare(generator, kv - prm_kv, (kv - prm_kv) // generator.block_bytes),
              ModelShare(prm, prm_kv, prm_kv // prm.block_bytes))
    for name, share in zip(("generator", "PRM"), shares):
        if share.blocks < 1:
            raise ConfigError(f"memory split {fraction:.2f} leaves the {name} no KV block "
                              f"({format_bytes(share.kv_bytes)} < one block of {format_bytes(share.profile.block_bytes)}); "
                              "move the split or raise --device-memory")
    return MemoryPlan(*common, *shares)


def _elastic_plan(common: tuple, generator: MemoryProfile, prm: MemoryProfile,
                  element_sizes: tuple[int, int]) -> MemoryPlan:
    kv, fraction = common[4], common[5]
    layout = ChunkLayout.for_blocks(kv, {"generator": generator.block_bytes, "prm": prm.block_bytes},
                                    {"generator": element_sizes[0], "prm": element_sizes[1]})
    if layout.num_chunks < 2:
        minimum_kv = 2 * layout.chunk_bytes
        raise ConfigError(f"elastic memory needs at least two KV chunks of {format_bytes(layout.chunk_bytes)} "
                          f"but the budget leaves {format_bytes(kv)} for KV; raise --device-memory by "
                          f"{format_bytes(minimum_kv - kv)} or use a static split")
    prm_chunks = min(max(round(layout.num_chunks * fraction), 1), layout.num_chunks - 1)
    gen_chunks = layout.num_chunks - prm_chunks
    shares = (ModelShare(generator, gen_chunks * layout.chunk_bytes,
                         gen_chunks * layout.members["generator"].blocks_per_chunk),
              ModelShare(prm, prm_chunks * layout.chunk_bytes,
                         prm_chunks * layout.members["prm"].blocks_per_chunk))
    return MemoryPlan(*common, *shares, chunks=layout, prm_chunks=prm_chunks)


def format_plan(plan: MemoryPlan) -> str:
    """The profile and split as a small text table (`tts models profile`, run logs)."""
    rows = [("", "generator", "PRM")]
    g, p = plan.generator, plan.prm
    rows += [
        ("model", g.profile.model, p.profile.model),
        ("weights", format_bytes(g.profile.weights_bytes), format_bytes(p.profile.weights_bytes)),
        (f"peak activations ({g.profile.profiled_tokens} tok)", format_bytes(g.profile.activation_bytes),
         format_bytes(p.profile.activation_bytes)),
        ("KV bytes / token / layer", str(g.profile.kv_bytes_per_token_per_layer),
         str(p.profile.kv_bytes_per_token_per_layer)),
        ("layers", str(g.profile.num_layers), str(p.profile.num_layers)),
        (f"KV block ({g.profile.block_size} tokens)", format_bytes(g.profile.block_bytes),
         format_bytes(p.profile.block_bytes)),
        ("KV share" + (" (start)" if plan.policy == "elastic" else ""), format_bytes(g.kv_bytes),
         format_bytes(p.kv_bytes)),
        ("KV blocks" + (" (start)" if plan.policy == "elastic" else ""), str(g.blocks), str(p.blocks)),
    ]
    width = max(len(r[0]) for r in rows)
    cols = [max(len(r[i]) for r in rows) for i in (1, 2)]
    lines = [f"{r[0]:<{width}}  {r[1]:>{cols[0]}}  {r[2]:>{cols[1]}}" for r in rows]
    lines += [
        f"budget {format_bytes(plan.budget_bytes)} x utilisation {plan.utilization} = "
        f"{format_bytes(plan.usable_bytes)}; non-torch {format_bytes(plan.non_torch_bytes)}; "
        f"KV {format_bytes(plan.kv_bytes)}",
        f"policy {plan.policy}: {plan.reason}",
        f"measured: {g.profile.method}",
    ]
    if plan.chunks is not None:
        lines.append(f"chunks: {plan.chunks.num_chunks} x {format_bytes(plan.chunks.chunk_bytes)} "
                     f"({plan.chunks.members['generator'].blocks_per_chunk} generator / "
                     f"{plan.chunks.members['prm'].blocks_per_chunk} PRM blocks each)")
    return "\n".join(lines)
