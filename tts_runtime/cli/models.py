"""`tts models list` and `tts models profile`."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from memory.split import format_plan
from tts_runtime.cli.common import command
from tts_runtime.cli.options import config_command
from tts_runtime.cohost.profile_plan import profile_plan
from tts_runtime.config import ConfigError
from tts_runtime.models.registry import ALIASES, BUILTIN_CONFIGS
from tts_runtime.runs.run_config import RunConfig


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


@config_command(models_app, "profile",
                only=("generator", "prm", "dtype", "device", "device_memory", "memory_utilization", "memory_policy",
                      "memory_split", "max_num_batched_tokens"))
def profile_command(
    run: RunConfig,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Weights, peak activations, non-torch memory and KV blocks of both models on one budget."""
    plan = profile_plan(run.models.generator, run.models.prm, run.models.dtype, run.engine.device, run.memory,
                        run.engine.scheduler.max_num_batched_tokens)
    typer.echo(json.dumps(plan.to_dict(), indent=2) if as_json else format_plan(plan))
