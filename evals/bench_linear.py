"""The CPU projection paths side by side on the demo models' real fp32 weights: every
projection of every layer once per "step" (a decode step's projections), at a few row
counts, each side in turn per round, medians; with the weight bytes streamed per second.

    python -m evals.bench_linear [--rows 1 4 16 64] [--rounds 9]

Run it natively and with TTS_CPU_FEATURES=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
(what an AVX2 CPU runs); docs/benchmarks/linear_avx2.md has the results.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn

import tts_runtime.cpu_features as cpu_features
from tts_runtime.executor.cpu.cpu_linear_fp32 import StreamedFp32Linear, load_fp32_linear_kernel
from tts_runtime.executor.layer_ops import PrepackedLinear, onednn_linear
from tts_runtime.models.layers import LinearFn
from tts_runtime.models.loader import load_model

MODELS = ("smollm2-135m-instruct", "gemma3-270m")



def projections(model: nn.Module) -> list[torch.Tensor]:
    return [m.weight for m in model.layers.modules() if isinstance(m, nn.Linear)]


def sides(model: nn.Module) -> dict[str, LinearFn]:
    prepacked = PrepackedLinear([model])
    out: dict[str, LinearFn] = {"oneDNN": onednn_linear, "oneDNN prepacked": prepacked}
    kernel = load_fp32_linear_kernel()
    out["streamed fp32"] = StreamedFp32Linear(kernel, [model], prepacked)
    out["streamed bf16-stored"] = StreamedFp32Linear(kernel, [model], prepacked, bf16_weights=True)
    return out


def step(fn: LinearFn, weights: list[torch.Tensor], xs: dict[int, torch.Tensor]) -> float:
    start = time.perf_counter()
    for w in weights:
        fn(xs[w.shape[1]], w, None)
    return time.perf_counter() - start


def bench_model(name: str, rows: list[int], rounds: int) -> list[dict]:
    model = load_model(name, torch.float32, torch.device("cpu")).model
    weights = projections(model)
    fp32_bytes = sum(w.numel() * 4 for w in weights)
    fns = sides(model)
    results = []
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n in rows:
            xs = {k: torch.randn(n, k, generator=gen) for k in {w.shape[1] for w in weights}}
            for fn in fns.values():  # packs, warms up
                step(fn, weights, xs)
            times: dict[str, list[float]] = {side: [] for side in fns}
            for _ in range(rounds):
                for side, fn in fns.items():
                    times[side].append(step(fn, weights, xs))
            base = statistics.median(times["oneDNN prepacked"])
            for side, t in times.items():
                med = statistics.median(t)
                stored = fp32_bytes // 2 if "bf16" in side else fp32_bytes
                results.append(dict(model=name, rows=n, side=side, ms=med * 1e3, speedup=base / med,
                                    gb_s=stored / med / 1e9))
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    print(f"# {cpu_features.describe()}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"ATen {torch.backends.cpu.get_cpu_capability()}")
    results = [r for name in MODELS for r in bench_model(name, args.rows, args.rounds)]
    print("| model | rows | side | ms per step (median) | vs oneDNN prepacked | weight GB/s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['model']} | {r['rows']} | {r['side']} | {r['ms']:.2f} | {r['speedup']:.2f}x | {r['gb_s']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
