"""Profile one engine step on a GPU: a batch-256 decode step of the generator's shape and
one PRM score forward, with the host side, to show where a step's time goes.

For each step it reports the host wall time of `Engine.step()`, the device time (the union
of the step's kernel intervals from torch.profiler), the share of the step the device sat
idle waiting for the host, the top ops by host and device time, the count of kernel
launches, and a cProfile of the host side over a few more steps (Python functions by
cumulative time). A Chrome trace of each profiled step is written beside the report.

    python -m evals.profile_gpu --out runs/gpu-profile
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from tts_runtime.config import CacheConfig, ConfigError, EngineConfig, SchedulerConfig
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import SamplingParams, ScoreParams
from tts_runtime.models.loader import load_model
from tts_runtime.models.registry import DEFAULT_PRM

_PROMPT_VOCAB = 32000  # random ids below every demo and seed tokenizer's special tokens


def _random_ids(count: int, length: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(100, _PROMPT_VOCAB, (count, length), generator=generator).tolist()


def _merged_busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (kernels of several streams overlap)."""
    busy, end_so_far = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if start >= end_so_far:
            busy += end - start
            end_so_far = end
        elif end > end_so_far:
            busy += end - end_so_far
            end_so_far = end
    return busy


def _profile_steps(engine: Engine, steps: int, trace: Path) -> dict:
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    prof.export_chrome_trace(str(trace))
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
    busy_us = _merged_busy_us(intervals)
    averages = prof.key_averages()
    return {
        "steps": steps,
        "wall_ms_per_step": 1e3 * wall / steps,
        "device_busy_ms_per_step": busy_us / 1e3 / steps,
        "device_busy_fraction": busy_us / 1e6 / wall,
        "kernels_per_step": len(kernels) / steps,
        "top_host_ops": averages.table(sort_by="self_cpu_time_total", row_limit=20),
        "top_device_ops": averages.table(sort_by="self_cuda_time_total", row_limit=20),
    }


def _host_profile(engine: Engine, steps: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
    return text.getvalue()


def profile_decode(model: str, batch: int, context: int, out: Path) -> dict:
    loaded = load_model(model, torch.bfloat16, torch.device("cuda"))
    per_seq = -(-(context + 256) // CacheConfig.block_size)
    engine = Engine(loaded.name, EngineConfig(
        cache=CacheConfig(num_blocks=batch * per_seq + batch, enable_prefix_caching=False),
        scheduler=SchedulerConfig(max_num_seqs=batch, max_num_batched_tokens=8192)), loaded=loaded)
    params = SamplingParams(temperature=0.8, max_tokens=200, ignore_eos=True)
    for i, ids in enumerate(_random_ids(batch, context, seed=1)):
        engine.add_request(f"d{i}", ids, params)
    while engine.pending_prefill_tokens() > 0:
        engine.step()
    for _ in range(10):  # graph replays and allocator warm before measuring
        engine.step()
    result = {"workload": f"decode {model} batch {batch} context {context}",
              **_profile_steps(engine, 5, out / "decode_trace.json"),
              "host_cprofile": _host_profile(engine, 20)}
    engine.shutdown()
    return result


def profile_score(model: str, beams: int, prefix: int, new: int, out: Path) -> dict:
    loaded = load_model(model, torch.bfloat16, torch.device("cuda"))
    engine = Engine(loaded.name, EngineConfig(
        cache=CacheConfig(num_blocks=4096, enable_prefix_caching=True),
        scheduler=SchedulerConfig(max_num_batched_tokens=8192), cuda_graphs=False), loaded=loaded)
    question = _random_ids(1, prefix, seed=2)[0]
    steps = _random_ids(beams, new, seed=3)
    params = ScoreParams(positions=[prefix + new - 1], candidate_token_ids=[10, 20])
    engine.score([question] * beams, ScoreParams(positions=[prefix - 1], candidate_token_ids=[10, 20]))
    for i, step in enumerate(steps):  # warm: one round of the same shape
        engine.add_request(f"w{i}", question + step, params)
    while engine.has_unfinished_requests():
        engine.step()
    fresh = _random_ids(beams, new, seed=4)
    for i, step in enumerate(fresh):
        engine.add_request(f"s{i}", question + step, params)
    result = {"workload": f"score {model}: {beams} beams, {prefix} cached + {new} new tokens each",
              **_profile_steps(engine, 1, out / f"score_trace_{model.replace(':', '_')}.json")}
    engine.shutdown()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-profile"))
    parser.add_argument("--decode-model", default="dummy:llama-3.2-1b")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--score-models", nargs="+", default=[DEFAULT_PRM, "dummy:llama-3.1-8b"])
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("error: evals.profile_gpu needs a CUDA GPU; torch sees none")
    args.out.mkdir(parents=True, exist_ok=True)
    results = [profile_decode(args.decode_model, args.batch, args.context, args.out)]
    for model in args.score_models:
        try:
            results.append(profile_score(model, beams=16, prefix=384, new=48, out=args.out))
        except ConfigError as exc:
            print(f"score profile of {model} skipped: {exc}")
    (args.out / "profile.json").write_text(json.dumps(results, indent=1))
    for result in results:
        print(f"\n== {result['workload']}")
        print(f"wall {result['wall_ms_per_step']:.2f} ms/step, device busy {result['device_busy_ms_per_step']:.2f} "
              f"ms/step ({100 * result['device_busy_fraction']:.0f}%), {result['kernels_per_step']:.0f} kernels/step")
        print(result["top_host_ops"])
        print(result["top_device_ops"])
        if "host_cprofile" in result:
            print(result["host_cprofile"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
