"""`tts models profile`: both models' memory profiles and the split they get on a budget.

A driver, like sweep.py (it loads models through the runtime layer); the CLI registers
`profile_command`.
"""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from memory.split import MemoryConfig, format_plan, parse_size, plan_memory
from tts_runtime.config import EngineConfig, SchedulerConfig, resolve_device, resolve_dtype
from tts_runtime.executor.kv_cache import element_size
from tts_runtime.models.loader import load_model
from tts_runtime.runtime import device_total, profile_models


def profile_command(
    generator: Annotated[str, typer.Option(help="generator model")] = "smollm2-135m-instruct",
    prm: Annotated[str, typer.Option(help="PRM model")] = "gemma3-270m",
    dtype: Annotated[str, typer.Option(help="auto, float32, bfloat16, float16")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:N")] = "auto",
    device_memory: Annotated[Optional[str], typer.Option(help="memory budget, e.g. 6GiB")] = None,
    utilization: Annotated[float, typer.Option(help="fraction of the budget the runtime may use")] = 0.9,
    memory_policy: Annotated[str, typer.Option(help="static, auto or elastic")] = "static",
    memory_split: Annotated[float, typer.Option(help="PRM fraction of the KV budget (static)")] = 0.3,
    max_num_batched_tokens: Annotated[int, typer.Option(help="engine token budget per step")] = 2048,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Weights, peak activations, non-torch memory and KV blocks of both models on one budget."""
    memory = MemoryConfig(device_memory=parse_size(device_memory) if device_memory else None,
                          utilization=utilization, policy=memory_policy, prm_fraction=memory_split)
    config = EngineConfig(device=device, scheduler=SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens))
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    gen_loaded = load_model(generator, torch_dtype, dev)
    prm_loaded = load_model(prm, torch_dtype, dev)
    profiles = profile_models(gen_loaded, prm_loaded, config)
    size = element_size(torch_dtype)
    plan = plan_memory(memory, *profiles, device_total=device_total(dev), element_sizes=(size, size))
    typer.echo(json.dumps(plan.to_dict(), indent=2) if as_json else format_plan(plan))
