"""Builds the C++ CPU kernels this CPU uses, all at once (`make setup` runs it):

    python -m tts_runtime.executor.cpu.cpu_build

Each kernel compiles in its own process (one C++ file each, so the compiles run side by side,
one per core), for `cpu_features.march()`, into the kernel cache (cpu_extensions.py). Kernels
the CPU cannot run are skipped with one line; a kernel that does not build gets one line
naming what runs instead. Prints one line per kernel and exits 0 either way: every kernel
has a torch fallback, so a missing one costs speed, not function.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import tts_runtime.cpu_features as cpu_features


@dataclass(frozen=True)
class Kernel:
    label: str
    module: str
    loader: str
    fallback: str  # what runs without it
    requires: str | None = None  # a cpu_features flag it needs


KERNELS = (
    Kernel("paged attention kernel", "tts_runtime.executor.cpu.cpu_attention", "load_kernel",
           "the torch attention backend will be used"),
    Kernel("layer ops", "tts_runtime.executor.cpu.cpu_layer_ops", "load_layer_ops_kernel",
           "torch's eager ops will be used"),
    Kernel("streamed linear kernel", "tts_runtime.executor.cpu.cpu_linear", "load_linear_kernel",
           "--linear-backend streamed runs oneDNN", requires="avx512_bf16"),
    Kernel("streamed fp32 linear kernel", "tts_runtime.executor.cpu.cpu_linear_fp32", "load_fp32_linear_kernel",
           "fp32 projections run on oneDNN", requires="avx2"),
)

_FEATURE_NAMES = {"avx512_bf16": "AVX512-BF16", "avx2": "AVX2 and FMA"}


def _march_has(march: str, feature: str) -> bool:
    """Whether an x86-64-vN -march (a TTS_CPU_FEATURES level's) enables `feature`."""
    return any(target == march and feature in kept for target, kept in cpu_features.LEVELS.values())


def skip_reason(kernel: Kernel) -> str | None:
    """Why this CPU (as cpu_features sees it) does not use `kernel`; None: it does."""
    if kernel.requires is None or cpu_features.has(kernel.requires):
        return None
    return f"needs {_FEATURE_NAMES.get(kernel.requires, kernel.requires)}"


def _build(kernel: Kernel, march: str | None) -> tuple[bool, float, str]:
    """In a worker: builds or loads `kernel`; (ok, seconds, the error when not ok)."""
    from tts_runtime.executor.cpu.cpu_extensions import KernelUnavailable

    start = time.perf_counter()
    try:
        getattr(importlib.import_module(kernel.module), kernel.loader)(march)
    except KernelUnavailable as exc:
        return False, time.perf_counter() - start, str(exc)
    return True, time.perf_counter() - start, ""


def build_all(march: str | None = None, jobs: int | None = None, out=sys.stdout) -> dict[str, str]:
    """Builds every kernel this CPU uses (for `march`, default cpu_features.march()), `jobs`
    at a time (default: one per kernel, at most one per core); prints one line per kernel and
    returns {label: "built" | "skipped" | "failed"}."""
    target = march or cpu_features.march()
    todo, status = [], {}
    for kernel in KERNELS:
        reason = skip_reason(kernel)
        if march not in (None, "native") and kernel.requires is not None and not _march_has(march, kernel.requires):
            reason = f"needs {_FEATURE_NAMES.get(kernel.requires, kernel.requires)}, which -march={march} has not"
        if reason is not None:
            print(f"{kernel.label}: skipped, {reason}", file=out, flush=True)
            status[kernel.label] = "skipped"
        else:
            todo.append(kernel)
    if not todo:
        return status
    jobs = jobs or min(len(todo), os.cpu_count() or 1)
    start = time.perf_counter()
    # Separate processes, not threads: each build holds its own compiler, and a crash or a
    # stuck build lock in one does not take the others down. Spawned: no forked torch state.
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn")) as pool:
        futures = {kernel: pool.submit(_build, kernel, march) for kernel in todo}
        for kernel, future in futures.items():
            ok, seconds, error = future.result()
            if ok:
                print(f"{kernel.label}: ready ({seconds:.0f} s, -march={target})", file=out, flush=True)
                status[kernel.label] = "built"
            else:
                print(f"{kernel.label}: not built, {kernel.fallback} ({error})", file=out, flush=True)
                status[kernel.label] = "failed"
    print(f"CPU kernels: {time.perf_counter() - start:.0f} s for {len(todo)}, {jobs} at a time "
          f"(CPU features: {cpu_features.describe()})", file=out, flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tts_runtime.executor.cpu.cpu_build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--march", help="build for this -march instead of what TTS_CPU_FEATURES names "
                                        "(e.g. x86-64-v3)")
    parser.add_argument("--jobs", type=int, help="kernels built at a time (default: one per kernel, at most one per core)")
    args = parser.parse_args(argv)
    try:
        build_all(args.march, args.jobs)
    except cpu_features.CpuFeaturesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
