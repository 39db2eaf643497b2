"""Everything a short GPU lease should run, in priority order, under one deadline.

A lent GPU comes for minutes at a time (docs/gpu.md §0 says how to carry what the machine
lacks). This runs the chosen steps one after another, each as a child process with a
timeout that never passes the session's deadline, logs each step to its own file, and
packs the logs and reports into one archive after every step, so a run cut short still
returns what it finished.

    python -m evals.gpu_session --out $OUT --budget 540            # every step, in order
    python -m evals.gpu_session --out $OUT --budget 120 --steps tests-kernels profile
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

_CLI = [sys.executable, "-c", "from tts_runtime.cli import app; app()"]
_REPORTS = Path("docs/benchmarks")


@dataclass(frozen=True)
class Step:
    name: str
    command: list[str]
    seconds: int  # what the step needs; it gets at most this, and never past the deadline
    reports: tuple[str, ...] = ()  # files under docs/benchmarks/ the step writes


def _steps(work: Path) -> list[Step]:
    py = [sys.executable]
    return [
        Step("facts", ["bash", "-c", "nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,"
                       "clocks.max.sm,power.limit --format=csv; " + sys.executable + " -c 'import torch, triton, "
                       "transformers; print(torch.__version__, torch.version.cuda, triton.__version__, "
                       "transformers.__version__, torch.cuda.get_device_name(0))'"], 30),
        # GPU tests that need no model files.
        Step("tests-kernels", py + ["-m", "pytest", "-q", "-rs", "-m", "gpu",
                                    "tests/executor/attention/test_triton_attention.py",
                                    "tests/executor/test_gpu_path.py", "-k", "not cuda_models and not parity and "
                                    "not end_to_end and not graph"], 240),
        # Issue 35's GPU targets first among the steps that load models (a lease's last call has
        # been cut short before): the PRM forward's fitted fixed cost (graphs on; off in "eager
        # scores") and the engines' busy fractions, with the host-hiding configuration of the
        # simulated H100 beside the defaults; then the profile of one step of each engine.
        Step("cohost", _CLI + ["bench", "cohost", "--limit", "20", "--rounds", "2", "--device", "cuda",
                               "--device-memory", "8GiB", "--variants",
                               "alternate,batched,batched + executor sampling + hide driver,hide driver,"
                               "executor sampling,eager scores"], 280,
             ("cohost.md", "cohost.json")),
        Step("profile", py + ["-m", "evals.profile_gpu", "--out", str(work / "profile"),
                              "--score-models", "gemma3-270m"], 100),
        Step("tests-models", py + ["-m", "pytest", "-q", "-rs", "-m", "gpu", "tests/",
                                   "--ignore=tests/executor/attention/test_triton_attention.py"], 200),
        Step("bench-decode", py + ["-m", "evals.bench_gpu", "--workloads", "decode", "--repeats", "2",
                                   "--decode-batches", "1", "64", "256", "--decode-contexts", "512", "2048",
                                   "--new-tokens", "128", "--report-name", "gpu_decode"], 300,
             ("gpu_decode.md", "gpu_decode.json")),
        Step("bench-prefill", py + ["-m", "evals.bench_gpu", "--workloads", "prefill", "--repeats", "2",
                                    "--prefill-requests", "128", "--report-name", "gpu_prefill"], 240,
             ("gpu_prefill.md", "gpu_prefill.json")),
        Step("tiered-kv", _CLI + ["bench", "tiered-kv", "--device", "cuda"], 180,
             ("tiered_kv.md", "tiered_kv.json")),
        Step("main-job-demo", _CLI + ["beam", "--dataset", "math500", "--limit", "100", "--device", "cuda",
                                      "--out", str(work / "beam-demo")], 300),
        Step("shifting-sweep", _CLI + ["sweep-memory", "--workload", "shifting", "--splits", "0.2,0.4,0.6",
                                       "--policies", "static,elastic", "--limit", "12", "--n", "4",
                                       "--beam-width", "2", "--num-iterations", "4", "--max-step-tokens", "64",
                                       "--problem-batch", "6", "--device", "cuda", "--device-memory", "3GiB",
                                       "--repeats", "2", "--out", str(work / "shifting"), "--markdown",
                                       str(work / "memory_shifting_gpu.md")], 300),
    ]


def _pack(work: Path, out: Path) -> None:
    with tarfile.open(out / "gpu_session.tgz", "w:gz") as archive:
        archive.add(work, arcname="gpu_session")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the archive goes ($OUT on the device)")
    parser.add_argument("--budget", type=float, required=True, help="seconds for all steps together")
    parser.add_argument("--steps", nargs="+", help="names of the steps to run (default: all, in order)")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.budget
    work = Path("runs/gpu_session")
    work.mkdir(parents=True, exist_ok=True)
    steps = _steps(work.resolve())
    chosen = [s for s in steps if args.steps is None or s.name in args.steps]
    unknown = set(args.steps or ()) - {s.name for s in steps}
    if unknown:
        print(f"error: unknown step(s) {', '.join(sorted(unknown))}; choose from {', '.join(s.name for s in steps)}")
        return 2
    summary = []
    for step in chosen:
        left = deadline - time.monotonic()
        if left < 20:
            summary.append(f"{step.name}: not run ({left:.0f} s left)")
            continue
        timeout = min(step.seconds, left - 10)
        started = time.monotonic()
        with open(work / f"{step.name}.log", "w") as log:
            try:
                rc = subprocess.run(step.command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        for report in step.reports:
            if (_REPORTS / report).is_file():
                shutil.copy(_REPORTS / report, work / report)
        summary.append(f"{step.name}: rc {rc} in {time.monotonic() - started:.0f} s (limit {timeout:.0f} s)")
        print(summary[-1], flush=True)
        (work / "summary.txt").write_text("\n".join(summary) + "\n")
        _pack(work, args.out)
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
