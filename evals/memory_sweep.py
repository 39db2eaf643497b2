"""`tts sweep-memory`: one search workload at many memory settings, side by side.

Settings are every static split of `--splits` plus `auto` and `elastic` (`--policies`).
Each setting builds a fresh Runtime over the same loaded models and memory profiles and
runs the same search on the same problems (seeded, so the searches match). With
`--repeats R` the settings run round-robin R times (A, B, C, A, B, C, ...) and every
number is the median over the repeats: the machines are shared and noisy. With
`--replicas N` the (setting, repeat) runs go out from one queue to N Ray replicas
(tts_runtime/runs/ray_pool.py), each of which loads and profiles the models once; runs side by
side share the machine, so compare settings within one sweep only. With `--backend vllm`
both models run on vLLM engines sized by each static split (and `auto`); vLLM cannot
follow `elastic`, and it reports no block events, so its rows have no thrash counts or
block timelines (null in the tables, those plots left out).

Writes to the sweep folder:

* `sweep.csv` and `sweep.json`: one row per setting with the columns in SWEEP_COLUMNS;
  the JSON also holds the command, machine, search and memory configuration, both
  memory profiles, the best setting and the auto/elastic ratios, and each setting's
  memory metrics (block timelines, elastic chunk moves);
* `throughput_vs_split.png` (auto and elastic marked), `blocks_over_steps.png` (lowest,
  best and highest static split), `hit_rate_vs_split.png`, `thrash_vs_split.png`;
* with `--markdown PATH`: a benchmark report (table, plots, machine, versions, command,
  comparison with the thesis) at PATH, its plots beside it.

This is a driver (like the CLI): it imports the search and evals layers.
"""

from __future__ import annotations

import csv
import gc
import json
import shlex
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import typer

from evals.bench import SideBySide
from evals.shifting_workload import WorkloadPhase, workload_phases
from memory.profile import MemoryProfile, format_bytes
from memory.split import POLICIES, MemoryConfig, Workload
from search.config import SearchConfig
from search.driver import run_search
from search.prm import make_prm_format
from search.prm_detect import detect_prm_format
from search.prm_fit import check_prm_fit
from search.prompts import PromptBuilder
from tts_runtime.cohost.runtime import Runtime, check_backend, profile_models
from tts_runtime.config import ConfigError, EngineConfig, resolve_device, resolve_dtype
from tts_runtime.engine.request import RequestError
from tts_runtime.executor.device_memory import return_freed_host_memory
from tts_runtime.models.loader import LoadedModel, load_model
from tts_runtime.models.registry import require_tokenizers
from tts_runtime.runs.datasets import Problem, load_problems
from tts_runtime.runs.environment import machine_info
from tts_runtime.options import option
from tts_runtime.runs.run_config import RunConfig
from tts_runtime.runs.run_folder import fresh_folder
from tts_runtime.runs.scale_config import ScaleOut

if TYPE_CHECKING:
    from tts_runtime.runs.ray_pool import ReplicaInfo

SWEEP_COLUMNS = (
    "setting",  # "static 0.30", "auto", "elastic"
    "policy",
    "prm_fraction",  # static: as set; auto: as chosen; elastic: PRM share of the pool, averaged over steps
    "problems",
    "seconds",
    "problems_per_s",
    "accuracy",
    "generator_tokens_per_s",  # generated tokens / s
    "prm_tokens_per_s",  # scored prompt tokens / s (cached or computed)
    "generator_blocks",  # KV blocks owned, averaged over steps
    "prm_blocks",
    "generator_hit_rate",  # prefix-cache block hits / lookups
    "prm_hit_rate",
    "generator_thrash",  # misses on blocks computed before and evicted since
    "prm_thrash",
    "generator_preemptions",
    "prm_preemptions",
    "preemptions",
    "peak_memory_bytes",  # GPU: torch peak allocated; CPU: process peak RSS (VmHWM)
    "chunks_moved",  # elastic: KV chunks moved between the models
    "phase_seconds",  # seconds of each workload phase, in order (medians over repeats)
    "error",  # why the setting could not run the workload (a request larger than its pool); else empty
)
THESIS_BEST_SPLIT = 0.3


@dataclass(frozen=True)
class SweepSetting:
    policy: str
    prm_fraction: float | None = None  # static only

    @property
    def label(self) -> str:
        return f"static {self.prm_fraction:.2f}" if self.policy == "static" else self.policy


# Splits closer than a percent of the memory differ by less than a KV block of the demo
# models, and every setting is a full search: past these, a sweep is a typo, not a plan.
MAX_SPLITS = 99
MAX_REPEATS = 100
MAX_RUNS = 2000  # settings x repeats
MAX_REPLICAS = 1024
MAX_THREADS = 1024


def parse_splits(text: str) -> list[float]:
    """'0.1:0.9:0.1' (start:stop:step, stop included) or '0.2,0.5'."""
    try:
        if ":" in text:
            start, stop, step = (float(x) for x in text.split(":"))
            if step <= 0:
                raise ValueError
            count = int(round((stop - start) / step)) + 1
        else:
            splits = [float(x) for x in text.split(",") if x.strip()]
            count = len(splits)
    except (ValueError, OverflowError):
        raise ConfigError(f"cannot read splits '{text}'; write start:stop:step (0.1:0.9:0.1) "
                          "or a list (0.2,0.5)") from None
    if count > MAX_SPLITS:  # checked before the list is built: a tiny step would fill the memory
        raise ConfigError(f"splits '{text}' name {count} splits; at most {MAX_SPLITS} (a step of at least "
                          "0.01, e.g. 0.1:0.9:0.1)")
    if ":" in text:
        splits = [round(start + i * step, 6) for i in range(count)]
    if not splits and ":" in text:
        raise ConfigError(f"splits '{text}' name no split: start:stop:step needs start <= stop")
    bad = [s for s in splits if not 0 < s < 1]
    if not splits or bad:
        raise ConfigError(f"memory split must be in (0, 1), got {', '.join(map(str, bad)) or text}")
    return splits


def check_sweep_bounds(settings: list[SweepSetting], repeats: int, replicas: int | None,
                       threads_per_replica: int) -> None:
    """The sweep's size and parallelism, refused in one line when absurd (before any model loads)."""
    if not 1 <= repeats <= MAX_REPEATS:
        raise ConfigError(f"--repeats must be in 1..{MAX_REPEATS}, got {repeats}")
    if len(settings) * repeats > MAX_RUNS:
        raise ConfigError(f"{len(settings)} settings x {repeats} repeats is {len(settings) * repeats} searches; "
                          f"at most {MAX_RUNS}: use fewer --splits or --repeats")
    if replicas is not None and not 1 <= replicas <= MAX_REPLICAS:
        raise ConfigError(f"--replicas must be in 1..{MAX_REPLICAS}, got {replicas}")
    if not 1 <= threads_per_replica <= MAX_THREADS:
        raise ConfigError(f"--threads-per-replica must be in 1..{MAX_THREADS}, got {threads_per_replica}")


def settings_for(splits: list[float], policies: list[str]) -> list[SweepSetting]:
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise ConfigError(f"unknown memory policy '{','.join(unknown)}'; choose one of {', '.join(POLICIES)}")
    settings = []
    for policy in policies:
        settings += [SweepSetting("static", s) for s in splits] if policy == "static" else [SweepSetting(policy)]
    return settings


def search_workload(config: SearchConfig, problems: list[Problem], generator: LoadedModel,
                    prm: LoadedModel) -> Workload:
    """The expected KV demand of a beam search, for the auto and elastic policies: real
    prompt lengths from both models' prompt formats; every in-flight problem's beams
    halfway through the iterations with half-length steps (only the ratio of the two
    models' demands decides the split)."""
    questions = [p.question for p in problems] or ["?"]
    builder = PromptBuilder(generator.tokenizer)
    format_name = config.prm_format or detect_prm_format(prm.name)
    check_prm_fit(format_name, prm.name, prm.tokenizer)
    prm_format = make_prm_format(format_name, prm.tokenizer)
    gen_prompt = statistics.fmean(len(builder.prompt_token_ids(q)) for q in questions)
    prm_prompt = statistics.fmean(len(prm_format.build(q, ["."]).token_ids) for q in questions)
    in_flight = min(config.problem_batch, max(len(problems), 1))
    return Workload.beam_search(config.n, in_flight, gen_prompt, prm_prompt,
                                steps=config.num_iterations / 2, step_tokens=config.max_step_tokens / 2)


@dataclass
class SweepModels:
    """What every setting shares: the loaded models and their profiles."""

    generator: LoadedModel
    prm: LoadedModel
    profiles: tuple[MemoryProfile, MemoryProfile]


class _PeakMemory:
    """Peak memory between reset() and read(): the torch allocator's on GPU, the process's
    resident set (Linux VmHWM, reset through /proc/self/clear_refs) on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            return_freed_host_memory()  # else the peak counts earlier settings' freed heap
            Path("/proc/self/clear_refs").write_text("5")

    def read(self) -> int:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc/self/status")


def run_setting(setting: SweepSetting, models: SweepModels, phases: list[WorkloadPhase],
                memory: MemoryConfig, engine_config: EngineConfig, workload: Workload,
                backend: str = "native") -> tuple[dict, dict]:
    """The workload's searches, phase after phase on one runtime, at one memory setting:
    (sweep row, the runtime's memory metrics, with each phase's first step and seconds).

    A setting whose pool cannot hold one of the workload's sequences (an extreme static
    split on a tight budget) is a result, not a crash: its row has no throughput and says why."""
    config = replace(memory, policy=setting.policy, prm_fraction=setting.prm_fraction or memory.prm_fraction)
    peak = _PeakMemory(resolve_device(engine_config.device))
    peak.reset()
    runtime = Runtime(models.generator, models.prm, config, engine_config, workload=workload,
                      profiles=models.profiles, backend=backend)
    start = time.perf_counter()
    results, error, phase_marks = [], "", []
    try:
        for phase in phases:
            phase_start = time.perf_counter()
            phase_marks.append({"phase": phase.name, "first_step": runtime.num_steps})
            results += run_search(runtime, phase.problems, phase.search)
            phase_marks[-1]["seconds"] = time.perf_counter() - phase_start
    except RequestError as exc:
        results, error = [], str(exc)
    seconds = time.perf_counter() - start
    metrics = {**runtime.memory_metrics(), "phases": phase_marks}
    row = {
        "setting": setting.label, "policy": setting.policy, "prm_fraction": _prm_share(runtime),
        "problems": len(results), "seconds": seconds, "problems_per_s": len(results) / seconds,
        "accuracy": statistics.fmean(r.correct for r in results) if results else 0.0,
        "generator_tokens_per_s": runtime.generator.stats.generated_tokens / seconds,
        "prm_tokens_per_s": runtime.prm.stats.prompt_tokens / seconds,
    }
    for name in ("generator", "prm"):
        blocks = metrics[name]["blocks"]
        # vLLM allocates its blocks once and emits no block events: no mean, no thrash count.
        row[f"{name}_blocks"] = blocks.get("mean", blocks["start"])
        row[f"{name}_hit_rate"] = metrics[name]["hit_rate"]
        thrash = metrics[name]["thrash_events"]
        row[f"{name}_thrash"] = thrash if isinstance(thrash, int) else None
        row[f"{name}_preemptions"] = metrics[name]["preemptions"]
    row["preemptions"] = row["generator_preemptions"] + row["prm_preemptions"]
    row["peak_memory_bytes"] = peak.read()
    row["chunks_moved"] = metrics["elastic"]["chunks_moved"] if metrics["elastic"] else 0
    row["phase_seconds"] = [] if error else [mark["seconds"] for mark in phase_marks]
    row["error"] = error
    runtime.shutdown()
    return row, metrics


def _prm_share(runtime: Runtime) -> float:
    """The PRM's fraction of the KV budget: as planned, or (elastic) its share of the
    pool's chunks averaged over the run's steps."""
    if runtime.pool is None:
        return runtime.plan.prm_fraction
    timeline = runtime.trackers["prm"].timeline
    per_chunk = runtime.plan.chunks.members["prm"].blocks_per_chunk
    owned = [u + c + f for u, c, f in zip(timeline.in_use, timeline.cached, timeline.free)]
    if not owned:
        return runtime.plan.prm_fraction
    return statistics.fmean(owned) / per_chunk / runtime.plan.chunks.num_chunks


class SweepReplica:
    """A Ray actor for `--replicas`: loads and profiles the models once, then runs the
    settings it is handed, one at a time, each on a fresh Runtime."""

    def __init__(self, generator: str, prm: str, dtype: str, engine_config: EngineConfig, threads: int) -> None:
        torch.set_num_threads(threads)
        dev = resolve_device(engine_config.device)
        gen_loaded = load_model(generator, resolve_dtype(dtype, dev), dev)
        prm_loaded = load_model(prm, resolve_dtype(dtype, dev), dev)
        self.models = SweepModels(gen_loaded, prm_loaded, profile_models(gen_loaded, prm_loaded, engine_config))

    def ready(self) -> ReplicaInfo:
        from tts_runtime.runs import ray_pool  # Ray only where replicas run

        return ray_pool.ReplicaInfo.here()

    def run(self, setting: SweepSetting, phases: list[WorkloadPhase], memory: MemoryConfig,
            engine_config: EngineConfig, workload: Workload) -> tuple[dict, dict]:
        result = run_setting(setting, self.models, phases, memory, engine_config, workload)
        gc.collect()  # the finished runtime's KV pool goes before the next one is built
        return result


@dataclass(frozen=True)
class SweepParallel:
    """`--replicas N`: settings run side by side on N Ray replicas, each loading the models."""

    scale: ScaleOut
    generator: str
    prm: str
    dtype: str


def _failed_row(setting: SweepSetting, error: str) -> dict:
    row = {column: 0 for column in SWEEP_COLUMNS}
    return {**row, "setting": setting.label, "policy": setting.policy, "phase_seconds": [],
            "prm_fraction": setting.prm_fraction or 0.0, "error": error}


def _run_parallel(settings: list[SweepSetting], phases: list[WorkloadPhase], memory: MemoryConfig,
                  engine_config: EngineConfig, workload: Workload, repeats: int, parallel: SweepParallel,
                  echo) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """Every (setting, repeat) from one queue, in round-robin order, over the replicas."""
    from tts_runtime.runs.ray_pool import ReplicaPool, WorkItem, ray_cluster  # imports Ray: only for --replicas

    by_key = {f"{s.label}#{r}": s for r in range(repeats) for s in settings}
    items = [WorkItem(key, (s, phases, memory, engine_config, workload)) for key, s in by_key.items()]
    runs: dict[str, list[dict]] = {}
    metrics: dict[str, dict] = {}
    with ray_cluster(parallel.scale):
        pool = ReplicaPool(SweepReplica, (parallel.generator, parallel.prm, parallel.dtype, engine_config,
                                          parallel.scale.threads_per_replica), parallel.scale)
        try:
            pool.wait_ready()
            for outcome in pool.run("run", items):
                setting = by_key[outcome.key]
                row, setting_metrics = (_failed_row(setting, outcome.error), None) if outcome.error else outcome.value
                if setting_metrics is not None:
                    metrics.setdefault(setting.label, setting_metrics)
                runs.setdefault(setting.label, []).append(row)
                echo(f"  {setting.label:<12} {row['problems_per_s']:.4f} problems/s"
                     + (f"  FAILED: {row['error']}" if row["error"] else ""))
        finally:
            pool.shutdown()
    return runs, metrics


@dataclass
class SweepResult:
    rows: list[dict]
    metrics: dict[str, dict]  # per setting label: the first repeat's memory metrics
    summary: dict

    def timelines(self) -> dict[str, dict]:
        """Per setting, each model's block timeline (none on vLLM)."""
        return {label: {m: metrics[m]["timeline"] for m in ("generator", "prm")}
                for label, metrics in self.metrics.items() if isinstance(metrics["generator"]["timeline"], dict)}


def run_sweep(settings: list[SweepSetting], models: SweepModels, phases: list[WorkloadPhase],
              memory: MemoryConfig, engine_config: EngineConfig, workload: Workload, repeats: int = 1,
              echo=typer.echo, parallel: SweepParallel | None = None, backend: str = "native") -> SweepResult:
    if parallel is not None:
        runs, metrics = _run_parallel(settings, phases, memory, engine_config, workload, repeats, parallel, echo)
        rows = [_median_row(runs[s.label]) for s in settings]
        return SweepResult(rows, metrics, _summary(rows))
    metrics: dict[str, dict] = {}
    failed: dict[str, dict] = {}

    def variant(setting: SweepSetting):
        def run() -> dict:
            # A setting whose pool cannot hold a sequence fails the same way every time
            # (seeded sampling, deterministic scheduling): repeating it only costs time.
            if setting.label in failed:
                return failed[setting.label]
            row, setting_metrics = run_setting(setting, models, phases, memory, engine_config, workload, backend)
            if row["error"]:
                failed[setting.label] = row
            gc.collect()  # the finished runtime's KV pool goes before the next one is built
            metrics.setdefault(setting.label, setting_metrics)
            echo(f"  {setting.label:<12} {row['problems_per_s']:.4f} problems/s  "
                 f"thrash {row['generator_thrash']}/{row['prm_thrash']}  preemptions {row['preemptions']}"
                 + (f"  FAILED: {row['error']}" if row["error"] else ""))
            return row
        return run

    side = SideBySide("memory sweep")
    side.run({s.label: variant(s) for s in settings}, repeats)
    rows = [_median_row(side.runs[s.label]) for s in settings]
    return SweepResult(rows, metrics, _summary(rows))


def _median_row(runs: list[dict]) -> dict:
    first = runs[0]
    row = {k: statistics.median(r[k] for r in runs) if isinstance(first[k], (int, float)) else first[k]
           for k in SWEEP_COLUMNS}
    row["phase_seconds"] = [statistics.median(phase) for phase in zip(*(r["phase_seconds"] for r in runs))]
    return row


def _summary(rows: list[dict]) -> dict:
    best = max(rows, key=lambda r: r["problems_per_s"])
    static = [r for r in rows if r["policy"] == "static" and not r["error"]]
    summary = {"best": best["setting"], "best_problems_per_s": best["problems_per_s"]}
    if static:
        best_static = max(static, key=lambda r: r["problems_per_s"])
        summary["best_static"] = best_static["setting"]
        summary["best_static_split"] = best_static["prm_fraction"]
        for row in rows:
            if row["policy"] != "static":
                summary[f"{row['policy']}_vs_best_static"] = row["problems_per_s"] / best_static["problems_per_s"]
        switching = phase_switching_seconds(static)
        if switching is not None:
            summary["phase_switching_gain"] = sum(best_static["phase_seconds"]) / switching
    return summary


def phase_switching_seconds(static_rows: list[dict]) -> float | None:
    """A shifting workload's time if each phase ran at the static split fastest in it (an
    oracle that re-splits at the phase boundary): how much any policy that moves memory
    only between phases could gain. None for a one-phase workload."""
    phases = list(zip(*(row["phase_seconds"] for row in static_rows)))
    if len(phases) < 2:
        return None
    return sum(min(seconds) for seconds in phases)


def timeline_labels(rows: list[dict]) -> list[str]:
    """Lowest, best and highest static split (each once) and elastic (its chunk moves show
    as the owned lines), or every setting without static ones."""
    static = sorted((r for r in rows if r["policy"] == "static"), key=lambda r: r["prm_fraction"])
    if not static:
        return [r["setting"] for r in rows]
    best = max(static, key=lambda r: r["problems_per_s"])
    shown = [static[0], best, static[-1], *(r for r in rows if r["policy"] == "elastic")]
    return list(dict.fromkeys(r["setting"] for r in shown))


def write_outputs(result: SweepResult, out_dir: Path, header: dict) -> list[Path]:
    """sweep.csv, sweep.json and the plots; returns the plot paths."""
    # matplotlib takes 0.3 s to import: every `tts` command would pay it, not only the sweep.
    from evals.memory_plots import plot_hit_rate, plot_sweep, plot_throughput

    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / "sweep.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=SWEEP_COLUMNS)
        writer.writeheader()
        writer.writerows(result.rows)
    payload = {**header, "columns": list(SWEEP_COLUMNS), "rows": result.rows, "summary": result.summary,
               "settings": result.metrics}
    (out_dir / "sweep.json").write_text(json.dumps(payload, indent=2))
    timelines = result.timelines()
    if not timelines:  # vLLM: no block timelines or thrash counts to draw
        return [plot_throughput(result.rows, out_dir / "throughput_vs_split.png"),
                plot_hit_rate(result.rows, out_dir / "hit_rate_vs_split.png")]
    phase_starts = {label: [mark["first_step"] for mark in metrics.get("phases", [])[1:]]
                    for label, metrics in result.metrics.items()}
    return plot_sweep(result.rows, timelines, timeline_labels(result.rows), out_dir, phase_starts)


def _cell(value: float | None, fmt: str | None) -> str:
    if value is None:  # not measured on this backend (thrash on vLLM)
        return "n/a"
    return format_bytes(int(value)) if fmt is None else fmt.format(value)


def format_table(rows: list[dict]) -> str:
    columns = [("setting", "setting", "{}"), ("PRM F", "prm_fraction", "{:.2f}"),
               ("problems/s", "problems_per_s", "{:.4f}"), ("gen tok/s", "generator_tokens_per_s", "{:.1f}"),
               ("PRM tok/s", "prm_tokens_per_s", "{:.1f}"), ("gen blocks", "generator_blocks", "{:.0f}"),
               ("PRM blocks", "prm_blocks", "{:.0f}"), ("gen hit", "generator_hit_rate", "{:.3f}"),
               ("PRM hit", "prm_hit_rate", "{:.3f}"), ("gen thrash", "generator_thrash", "{:.0f}"),
               ("PRM thrash", "prm_thrash", "{:.0f}"), ("preempt", "preemptions", "{:.0f}"),
               ("peak mem", "peak_memory_bytes", None), ("moved", "chunks_moved", "{:.0f}")]
    cells = [[title for title, _, _ in columns]]
    for row in rows:
        cells.append([_cell(row[key], fmt) for _, key, fmt in columns])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells)


def _phase_table(rows: list[dict], phases: list[str]) -> str:
    """Seconds per workload phase and setting (medians over repeats)."""
    lines = ["| setting | " + " | ".join(phases) + " | total |", "|---" * (len(phases) + 2) + "|"]
    for row in rows:
        if not row["error"]:
            seconds = row["phase_seconds"]
            lines.append(f"| {row['setting']} | " + " | ".join(f"{s:.1f}" for s in seconds)
                         + f" | {sum(seconds):.1f} |")
    return "\n".join(lines)


def write_markdown(result: SweepResult, header: dict, plots: list[Path], path: Path) -> Path:
    """The benchmark report: table, plots (copied beside the report), machine, command, thesis."""
    plot_dir = path.parent / path.stem
    plot_dir.mkdir(parents=True, exist_ok=True)
    # The report may sit beside its own sweep folder (--out runs/x --markdown runs/x.md).
    copied = [p if p.resolve() == (plot_dir / p.name).resolve() else Path(shutil.copy(p, plot_dir / p.name))
              for p in plots]
    summary, rows = result.summary, result.rows
    lines = [
        "# Memory split sweep: static, auto and elastic", "",
        f"Command: `{header['command']}`", "",
        "Machine: " + ", ".join(f"{k} {v}" for k, v in header["machine"].items() if v is not None), "",
        f"Models: generator `{header['generator']}`, PRM `{header['prm']}`; device memory "
        f"{format_bytes(header['memory']['budget_bytes'])} x utilisation {header['memory']['utilization']}, "
        f"KV budget {format_bytes(header['memory']['kv_bytes'])}; {header['problems']} problems; "
        f"search {header['search']['method']} n={header['search']['n']} M={header['search']['beam_width']} "
        f"iterations={header['search']['num_iterations']} step tokens={header['search']['max_step_tokens']}, "
        f"problem batch {header['search']['problem_batch']}; {header['repeats']} repeat(s), medians.", "",
        "```", format_table(rows), "```", "",
    ]
    if len(header["workload_phases"]) > 1:
        lines += ["Workload phases, one after the other on each setting's runtime (dashed lines in the "
                  "block timelines): " + "; ".join(
                      f"{p['phase']}: {p['problems']} problems, {p['search']['method']} n={p['search']['n']}, "
                      f"{p['search']['num_iterations']} iterations of {p['search']['max_step_tokens']} tokens, "
                      f"cap {p['search']['max_tokens']}" for p in header["workload_phases"]) + ".", ""]
        lines += [_phase_table(rows, [p["phase"] for p in header["workload_phases"]]), ""]
    lines += [f"- {r['setting']} could not run the workload: {r['error']}" for r in rows if r["error"]]
    lines += ["", f"Best setting: **{summary['best']}** ({summary['best_problems_per_s']:.4f} problems/s)."]
    if "best_static" in summary:
        lines.append(f"Best static split: **{summary['best_static_split']:.2f}** (thesis: {THESIS_BEST_SPLIT}).")
        # On a shifting workload elastic must beat every static split (issue 13 §5); on a
        # steady one it must come close to the best.
        shifting = len(header["workload_phases"]) > 1
        for policy, target in (("elastic", 1.10 if shifting else 0.95), ("auto", 0.90)):
            key = f"{policy}_vs_best_static"
            if key in summary:
                verdict = "meets" if summary[key] >= target else "misses"
                lines.append(f"{policy}: {summary[key]:.3f} x the best static split's problems/s "
                             f"({verdict} the target of >= {target:.2f}).")
        if "phase_switching_gain" in summary:
            lines.append(f"The fastest static split of each phase, switched at the boundary: "
                         f"{summary['phase_switching_gain']:.3f} x the best static split (how far "
                         f"apart the phases' needs are).")
    if result.timelines():  # block events exist (not on vLLM)
        lookups = sum(m[name]["lookups"] for m in result.metrics.values() for name in ("generator", "prm"))
        thrash = sum(m[name]["thrash_events"] for m in result.metrics.values() for name in ("generator", "prm"))
        lines += [f"Thrash: {thrash} events in {lookups} prefix-block lookups over all settings "
                  f"({thrash / lookups if lookups else 0:.2%}); the thesis calls thrash \"extremely rare\".", ""]
    lines += [f"![{p.stem}]({plot_dir.name}/{p.name})" for p in copied]
    path.write_text("\n".join(lines) + "\n")
    return path


def _command_line() -> str:
    """The command as a user re-runs it (`tts sweep-memory ...`), however it was started."""
    argv = sys.argv
    return shlex.join(["tts", *argv[1:]] if Path(argv[0]).name == "tts" else ["tts", "sweep-memory", *argv[1:]])


@dataclass(frozen=True)
class SweepPlan:
    """What the sweep varies and repeats, beside the run configuration it varies it on."""

    splits: str = option("0.1:0.9:0.1", "Static PRM fractions: start:stop:step or a comma list.")
    policies: str | None = option(None, "Comma list of static, auto, elastic (default all three; static,auto "
                                  "with --backend vllm).")
    repeats: int = option(1, "Round-robin repeats; numbers are medians (a setting that cannot run is run once).",
                          at_least=1)
    markdown: Path | None = option(None, "Also write a benchmark report here.")
    workload: str = option("steady", "steady (the search on every problem) or shifting (half the problems "
                           "generator-heavy best-of-N, then half PRM-heavy beam search; "
                           "evals/shifting_workload.py).")


def sweep_memory(run: RunConfig, plan: SweepPlan, echo: Callable[[str], None] = print) -> None:
    """Run one search workload at many memory splits and policies; write sweep.csv/json and plots."""
    policies = plan.policies or ("static,auto" if run.backend == "vllm" else "static,auto,elastic")
    chosen = [p.strip() for p in policies.split(",") if p.strip()]
    settings = settings_for(parse_splits(plan.splits), chosen)
    check_sweep_bounds(settings, plan.repeats, run.scale.replicas, run.scale.threads_per_replica)
    check_backend(run.backend, "elastic" if "elastic" in chosen else "static")
    search, memory, engine_config, backend = run.search, run.memory, run.engine, run.backend
    generator, prm, dtype, device = run.models.generator, run.models.prm, run.models.dtype, run.engine.device
    repeats = plan.repeats
    parallel = None
    scale = run.scale.scale_out(device)
    if scale is not None:
        parallel = SweepParallel(scale, generator, prm, dtype)
    problems = load_problems(run.dataset)
    require_tokenizers(generator, prm)
    phases = workload_phases(plan.workload, problems, search)
    dev = resolve_device(device)
    echo(f"loading {generator} and {prm} ...")
    gen_loaded = load_model(generator, resolve_dtype(dtype, dev), dev)
    prm_loaded = load_model(prm, resolve_dtype(dtype, dev), dev)
    echo("profiling memory (cached after the first time) ...")
    models = SweepModels(gen_loaded, prm_loaded, profile_models(gen_loaded, prm_loaded, engine_config))
    workload = search_workload(search, problems, gen_loaded, prm_loaded)
    echo(f"{len(settings)} settings x {repeats} repeat(s) on {len(problems)} problems")
    if parallel is not None:
        echo(f"running the settings on {parallel.scale.replicas} Ray replica(s)")
    result = run_sweep(settings, models, phases, memory, engine_config, workload, repeats,
                       parallel=parallel, backend=backend)
    first = next(iter(result.metrics.values()))["plan"]
    header = {
        "command": _command_line(),
        "machine": machine_info(), "generator": generator, "prm": prm, "dataset": run.dataset.dataset, "backend": backend,
        "problems": len(problems), "repeats": repeats, "search": search.to_dict(),
        "workload_phases": [{"phase": p.name, "problems": len(p.problems), "search": p.search.to_dict()}
                            for p in phases],
        "memory": {"budget_bytes": first["budget_bytes"], "utilization": first["utilization"],
                   "kv_bytes": first["kv_bytes"]},
        "profiles": [p.to_dict() for p in models.profiles],
        "workload": asdict(workload),
    }
    out_dir = Path(run.out) if run.out else fresh_folder(Path("runs") / time.strftime("sweep-%Y%m%d-%H%M%S"))
    plots = write_outputs(result, out_dir, header)
    echo(format_table(result.rows))
    summary = result.summary
    ratios = "; ".join(f"{k.split('_')[0]} {v:.3f}x best static" for k, v in summary.items() if k.endswith("_vs_best_static"))
    echo(f"best: {summary['best']} ({summary['best_problems_per_s']:.4f} problems/s)" + (f"; {ratios}" if ratios else ""))
    if plan.markdown is not None:
        echo(f"report: {write_markdown(result, header, plots, plan.markdown)}")
    echo(f"wrote {out_dir / 'sweep.csv'}, {out_dir / 'sweep.json'} and {len(plots)} plots")
