"""Both models' memory profiles and the split they get on a budget (`tts models profile`).

Loads the two models and profiles them through the runtime layer, then plans the split
with memory/split.py; the CLI (tts_runtime/cli/models.py) prints the plan.
"""

from __future__ import annotations

from memory.split import MemoryConfig, MemoryPlan, plan_memory
from tts_runtime.cohost.runtime import device_total, host_available, profile_models
from tts_runtime.config import EngineConfig, SchedulerConfig, resolve_device, resolve_dtype
from tts_runtime.executor.kv_cache import element_size
from tts_runtime.models.loader import load_model


def profile_plan(generator: str, prm: str, dtype: str, device: str, memory: MemoryConfig,
                 max_num_batched_tokens: int) -> MemoryPlan:
    """Load both models on `device`, profile them and plan `memory`'s split of the budget."""
    config = EngineConfig(device=device, scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens))
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    gen_loaded = load_model(generator, torch_dtype, dev)
    prm_loaded = load_model(prm, torch_dtype, dev)
    profiles = profile_models(gen_loaded, prm_loaded, config)
    size = element_size(torch_dtype)
    return plan_memory(memory, *profiles, device_total=device_total(device), element_sizes=(size, size),
                       host_available=host_available(device))
