"""`tts bench startup`: the whole main job as a user waits for it, the KV cache's memory zeroed
lazily (`--lazy-kv-zeroing`, the default) vs eagerly, side by side.

Each run is the real command, `tts beam --config RUN.json --out FOLDER [--no-lazy-kv-zeroing]`,
in a fresh process: what lazy zeroing changes is how a process gets its memory (torch.zeros
writes every page of the KV cache at start; an anonymous mapping's pages come zeroed from the
kernel when a block is first written), so the variants cannot share a process, and start-up
is part of what is measured. Per run: the command's wall time, the search's own seconds (its
metrics.json), the time outside the search (imports, model loading, memory profile, KV
allocation, writing the results), problems/min, and the process's peak resident memory.
Rounds alternate the order (A, B, then B, A ...) so that neither variant always runs first;
one untimed run first fills the model and kernel caches. Writes <stem>.json/md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evals.bench import write_report
from tts_runtime.options import option
from tts_runtime.runs.run_config import RunConfig

# label: the switch as given on the command line
VARIANTS = {"eager": "--no-lazy-kv-zeroing", "lazy": "--lazy-kv-zeroing"}


@dataclass(frozen=True)
class StartupBench:
    run: RunConfig
    rounds: int = option(4, "Rounds; each runs both variants, in alternating order; medians.", at_least=1)
    stem: str = option("lazy_kv", "Report name under docs/benchmarks/ (<stem>.json and .md).")


@dataclass(frozen=True)
class Measured:
    wall_seconds: float
    search_seconds: float
    problems_per_min: float
    peak_rss_gib: float
    results: list[dict[str, Any]]  # results.jsonl without its timings

    def row(self) -> dict[str, Any]:
        return {"wall_s": self.wall_seconds, "outside_search_s": self.wall_seconds - self.search_seconds,
                "search_s": self.search_seconds, "problems_per_min": self.problems_per_min,
                "peak_rss_gib": self.peak_rss_gib}


def run_command(config_file: Path, folder: Path, switch: str) -> list[str]:
    return [sys.executable, "-m", "tts_runtime.cli", "beam", "--config", str(config_file), "--out", str(folder),
            switch]


def measure(command: Sequence[str], folder: Path) -> Measured:
    """Run `command` to its end; its wall time and peak memory, and what it wrote to `folder`."""
    log = folder.with_suffix(".log")
    with log.open("w") as output:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
        # wait4, not wait: the resource use of this child alone (RUSAGE_CHILDREN sums them all).
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
    process.returncode = code = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    if code != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise RuntimeError(f"{' '.join(command)} exited with {code}: {tail[0]}")
    metrics = json.loads((folder / "metrics.json").read_text())["throughput"]
    lines = (folder / "results.jsonl").read_text().splitlines()
    results = [{key: value for key, value in json.loads(line).items() if key != "seconds"} for line in lines]
    return Measured(wall, metrics["seconds"], metrics["problems_per_min"], usage.ru_maxrss / (1 << 20), results)


def round_order(round_index: int) -> list[str]:
    labels = list(VARIANTS)
    return labels if round_index % 2 == 0 else labels[::-1]


def bench_startup(bench: StartupBench, *, command: Sequence[str], log: Callable[[str], None]) -> Path:
    runs: dict[str, list[Measured]] = {label: [] for label in VARIANTS}
    table = []
    with tempfile.TemporaryDirectory(prefix="tts-bench-startup-") as tmp:
        config_file = Path(tmp) / "run.json"
        config_file.write_text(json.dumps(bench.run.to_dict()))
        log("warm-up run (not counted): fills the model and kernel caches ...")
        measure(run_command(config_file, Path(tmp) / "warm-up", VARIANTS["lazy"]), Path(tmp) / "warm-up")
        for round_index in range(bench.rounds):
            for label in round_order(round_index):
                folder = Path(tmp) / f"{label}-{round_index + 1}"
                measured = measure(run_command(config_file, folder, VARIANTS[label]), folder)
                runs[label].append(measured)
                table.append({"round": round_index + 1, "variant": label, **measured.row()})
                log(f"  round {round_index + 1} {label}: {measured.wall_seconds:.1f} s wall, "
                    f"{measured.wall_seconds - measured.search_seconds:.1f} s outside the search, "
                    f"{measured.problems_per_min:.2f} problems/min, peak {measured.peak_rss_gib:.2f} GiB")
    summary = _summary(runs)
    return write_report(bench.stem, "Start-up and the main job: the KV cache zeroed lazily vs eagerly",
                        " ".join(command), summary, table, _notes(bench, summary))


def _summary(runs: dict[str, list[Measured]]) -> dict[str, Any]:
    medians = {label: {key: statistics.median(run.row()[key] for run in measured)
                       for key in measured[0].row()} for label, measured in runs.items()}
    eager, lazy = medians["eager"], medians["lazy"]
    return {"medians": medians,
            "lazy_over_eager": {key: lazy[key] / eager[key] for key in eager if eager[key]},
            "same_results": all(run.results == runs["eager"][0].results for measured in runs.values()
                                for run in measured)}


def _notes(bench: StartupBench, summary: dict[str, Any]) -> list[str]:
    search = bench.run.search
    eager, lazy = summary["medians"]["eager"], summary["medians"]["lazy"]
    return [
        f"{bench.run.dataset.limit} MATH-500 problems, beam search n={search.n} M={search.beam_width}, "
        f"{search.num_iterations} iterations, step cap {search.max_step_tokens} tokens, problem batch "
        f"{search.problem_batch}, device {bench.run.engine.device}, budget "
        f"{bench.run.memory.device_memory or 'default'}; {bench.rounds} rounds alternating the order, medians.",
        f"Outside the search (imports, loading, memory profile, KV allocation, writing): "
        f"{eager['outside_search_s']:.1f} s eager, {lazy['outside_search_s']:.1f} s lazy; whole command "
        f"{eager['wall_s']:.1f} s vs {lazy['wall_s']:.1f} s "
        f"({summary['lazy_over_eager']['wall_s']:.2f}x the wall time).",
        f"Search: {eager['problems_per_min']:.2f} vs {lazy['problems_per_min']:.2f} problems/min "
        f"({summary['lazy_over_eager']['problems_per_min']:.2f}x); lazy pays for each page when a block is "
        "first written, during the search.",
        f"Peak resident memory: {eager['peak_rss_gib']:.2f} GiB eager, {lazy['peak_rss_gib']:.2f} GiB lazy.",
        "Same results in every run (results.jsonl without timings): "
        f"{'yes' if summary['same_results'] else 'NO'}.",
    ]
