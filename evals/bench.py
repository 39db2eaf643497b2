"""Benchmark plumbing shared by every `tts bench` workload: side-by-side
timing (A, B, A, B … with medians), and writing JSON + a markdown table."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from tts_runtime.runs.environment import machine_info

BENCH_DIR = Path("docs/benchmarks")


@dataclass
class SideBySide:
    """Alternating repetitions of two or more variants, each returning a metrics dict."""

    name: str
    runs: dict[str, list[dict]] = field(default_factory=dict)

    def run(self, variants: dict[str, Callable[[], dict]], repeats: int) -> None:
        for _ in range(repeats):
            for label, fn in variants.items():
                start = time.perf_counter()
                metrics = fn()
                metrics.setdefault("seconds", time.perf_counter() - start)
                self.runs.setdefault(label, []).append(metrics)

    def median(self, label: str, key: str) -> float:
        return statistics.median(m[key] for m in self.runs[label])


def write_report(stem: str, title: str, command: str, summary: dict, table: list[dict],
                 notes: list[str]) -> Path:
    """docs/benchmarks/<stem>.json and .md with machine, versions and the command."""
    BENCH_DIR.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    payload = {"title": title, "command": command, "machine": machine, "summary": summary, "rows": table}
    (BENCH_DIR / f"{stem}.json").write_text(json.dumps(payload, indent=2))
    lines = [f"# {title}", "", f"Command: `{command}`", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items() if v is not None), ""]
    if table:
        keys = list(table[0])
        lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(_fmt(row[k]) for k in keys) + " |" for row in table]
        lines.append("")
    lines += [f"- {n}" for n in notes]
    path = BENCH_DIR / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def search_inputs(bench, log: Callable[[str], None], dtype: str = "auto") -> tuple[list, torch.device, tuple]:
    """The first `bench.limit` MATH-500 problems, the device, and the generator and PRM loaded
    once, in `dtype`, for every variant (a bench config with dataset_path, limit, device,
    generator, prm)."""
    from tts_runtime.runs.datasets import DatasetConfig, load_problems
    from tts_runtime.config import resolve_device, resolve_dtype
    from tts_runtime.models.loader import load_model

    problems = load_problems(DatasetConfig(dataset_path=bench.dataset_path, limit=bench.limit))
    device = resolve_device(bench.device)
    log(f"loading {bench.generator} + {bench.prm} ...")
    models = tuple(load_model(name, resolve_dtype(dtype, device), device) for name in (bench.generator, bench.prm))
    return problems, device, models
