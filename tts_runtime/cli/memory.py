"""`tts sweep-memory`: one search workload at many memory splits and policies (evals/memory_sweep.py)."""

from __future__ import annotations

import typer

from evals.memory_sweep import SweepPlan, sweep_memory
from tts_runtime.cli.options import config_command
from tts_runtime.runs.run_config import RunConfig


def register(app: typer.Typer) -> None:
    config_command(app, "sweep-memory", fixed={"eos_sampling": False},  # a step every iteration, the last too
                   defaults={"limit": 4, "max_step_tokens": 256, "problem_batch": 1}, plan=SweepPlan,
                   only=("method", "n", "beam_width", "num_iterations", "max_step_tokens", "temperature",
                         "problem_batch", "prm_format", "seed", "dataset", "dataset_path", "limit", "generator",
                         "prm", "dtype", "device", "device_memory", "memory_utilization", "max_num_batched_tokens",
                         "host_kv_memory", "out", "replicas", "ray_address", "threads_per_replica",
                         "backend", "linear_backend"))(sweep_memory_command)


def sweep_memory_command(run: RunConfig, settings: dict) -> None:
    """Run one search workload at many memory splits and policies; write sweep.csv/json and plots
    (--out is the sweep folder, default runs/sweep-<time>; --device-memory must be tight on CPU)."""
    sweep_memory(run, SweepPlan(**settings), echo=typer.echo)
