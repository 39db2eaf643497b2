"""`tts models list` and `tts models profile`."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from memory.split import MemoryConfig, parse_size
from memory.split import format_plan
from tts_runtime.cli.common import command
from tts_runtime.cohost.profile_plan import profile_plan
from tts_runtime.config import ConfigError
from tts_runtime.models.registry import ALIASES, BUILTIN_CONFIGS
import json


models_app = typer.Typer(help="Models the runtime can load.", no_args_is_help=True)


@command(models_app, "list")
def models_list() -> None:
    """Every model alias and built-in dummy shape: architecture, size, where it resolves."""
    table = Table("name", "architecture", "size", "resolves to")
    for alias in ALIASES.values():
        try:
            where = str(alias.locate())
        except ConfigError as exc:
            where = f"not installed: {exc}"
        table.add_row(alias.name, alias.architecture, alias.parameters, f"{where} ({alias.source})")
    for shape, config in BUILTIN_CONFIGS.items():
        table.add_row(f"dummy:{shape}", config["model_type"], _parameters(config), "random weights (built-in shape)")
    Console().print(table)


def _parameters(config: dict) -> str:
    """Parameter count of a Llama-shaped config, e.g. '1.24B'."""
    hidden, layers, inter = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]
    head_dim = config.get("head_dim", hidden // config["num_attention_heads"])
    attention = hidden * head_dim * (2 * config["num_attention_heads"] + 2 * config["num_key_value_heads"])
    embeddings = config["vocab_size"] * hidden * (1 if config.get("tie_word_embeddings") else 2)
    total = embeddings + layers * (attention + 3 * hidden * inter)
    return f"{total / 1e9:.2f}B" if total >= 1e9 else f"{total / 1e6:.0f}M"


@command(models_app, "profile")
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
    plan = profile_plan(generator, prm, dtype, device, memory, max_num_batched_tokens)
    typer.echo(json.dumps(plan.to_dict(), indent=2) if as_json else format_plan(plan))
