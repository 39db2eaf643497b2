"""The worker process of `tts bench engine --workload beam`'s AVX2 side (bench_beam.Avx2Worker
starts it with cpu_features.AVX2_ENVIRONMENT: the kernels built for x86-64-v3, torch and
oneDNN held to AVX2).

It reads one JSON line (the BeamBenchConfig's settings but its dtypes, and the runs to build:
label, TTS_VARIANTS name, dtype), builds and warms up those engines, answers {"ready": true},
then runs one repetition per label it reads and answers {"tokens", "seconds", "cpu_features"},
one JSON line each, until its input closes.

    python -m evals.bench_beam_avx2
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

import torch

import tts_runtime.cpu_features as cpu_features
from evals.bench_beam import TTS_VARIANTS, BeamBenchConfig, beam_prompts, tts_variant
from tts_runtime.models.loader import load_model


def _build(request: dict) -> dict[str, Callable[[], dict]]:
    config = BeamBenchConfig(**request["config"])
    switches = {name: found for name, _, found, _ in TTS_VARIANTS}
    runners, models = {}, {}
    for label, name, dtype in request["runs"]:
        if dtype not in models:
            loaded = load_model(config.generator, getattr(torch, dtype), torch.device("cpu"))
            models[dtype] = loaded, beam_prompts(loaded, config.prompts, config.prompt_tokens)
        loaded, prompts = models[dtype]
        runners[label] = tts_variant(loaded, prompts, config, switches[name])
    return runners


def main() -> None:
    # The answers keep this process's stdout; anything else it prints (a kernel build, a
    # model download) goes to stderr instead of into them.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def answer(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    runners = _build(json.loads(sys.stdin.readline()))
    answer({"ready": True})
    for line in sys.stdin:
        start = time.perf_counter()
        metrics = runners[line.strip()]()
        answer({**metrics, "seconds": time.perf_counter() - start, "cpu_features": cpu_features.describe()})


if __name__ == "__main__":
    main()
