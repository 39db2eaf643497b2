"""Search benchmark: beam search with tts vs the plain HF baseline, side by side.

Both sides run the same search code, configuration and problems (workload (c) of
DESIGN.md §9: beam search n=4, M=4 on the first K MATH-500 problems). tts keeps
`problem_batch` searches in flight on the engines; the baseline solves one problem at a
time with HF `generate` and whole-sequence PRM forwards. With several rounds the sides
alternate (tts, baseline, tts, baseline ...) and medians are reported, since the machine
is shared and noisy. Model loading is outside the timings. Writes `search.json` and
`search.md` (machine, versions, command, table) to `out_dir` (docs/benchmarks/).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evals.baselines import HFModels, run_baseline
from evals.bench import SideBySide
from memory.profile import format_bytes, size_option
from memory.split import DEFAULT_CPU_BUDGET, MemoryConfig
from search.config import SearchConfig
from search.driver import run_search
from search.problem import Problem
from search.score_cache import ScoreCache
from tts_runtime.cohost.runtime import Runtime
from tts_runtime.config import ConfigError, EngineConfig, ModelSpec, ParallelConfig, resolve_device
from tts_runtime.executor.device_memory import device_memory_info
from tts_runtime.runs.datasets import DatasetConfig, load_problems
from tts_runtime.runs.environment import environment
from tts_runtime.runs.metrics import EngineCounters, RunCounters, accuracy, throughput
from tts_runtime.models.registry import DEFAULT_GENERATOR, DEFAULT_PRM
from tts_runtime.options import option

_ZERO = RunCounters(EngineCounters(), EngineCounters(), 0, 0)
_BATCH_ONE = "tts-batch-1"
_TTS_VLLM, _SAL_VLLM = "tts-vllm", "sal-vllm"
_TORCH_KERNELS = "tts-torch-kernels"
# (key in a side's measurement, label, format)
_ROWS = (
    ("problems_per_min", "problems/min", "{:.2f}"),
    ("generator_tokens_per_s", "generator tokens/s", "{:.1f}"),
    ("prm_tokens_per_s", "PRM tokens/s", "{:.1f}"),
    ("seconds", "wall seconds", "{:.1f}"),
    ("accuracy", "accuracy", "{:.1%}"),
)


@dataclass
class SearchBench:
    config: SearchConfig = field(default_factory=lambda: SearchConfig(method="beam", n=4, beam_width=4))
    limit: int = 20
    generator: str = DEFAULT_GENERATOR
    prm: str = DEFAULT_PRM
    dtype: str = "auto"  # every side's weights and activations (tts_runtime.config.resolve_dtype)
    dataset_path: str | None = None
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    rounds: int = option(2, "Rounds, each running every side in turn (tts, tts batch 1, baseline, tts, ...); "
                         "medians reported.", at_least=1)
    baseline: bool = option(True, "Also run the plain HF baseline.")
    out_dir: Path = option(Path("docs/benchmarks"), "Where search.json and search.md go.")
    vllm: bool = False  # add tts on vLLM and search-and-learn's vLLM + HF configuration (evals/bench_vllm.py)
    batch_one: bool = option(True, "Also tts at problem batch 1 (the engine's share of the speed-up).")
    # tts on torch's kernels beside it: the attention backend that copies every context out
    # of the paged cache and F.linear for the projections, as before the in-place kernel and
    # the oneDNN projections (issue 15's "before").
    torch_kernels: bool = option(False, "Also tts on torch's kernels: the attention backend that copies each "
                                 "context out of the cache, F.linear and eager elementwise ops.")
    parallel: ParallelConfig = field(default_factory=ParallelConfig)  # tts's pipeline stages (--pp)


@dataclass
class BenchReport:
    data: dict[str, Any]
    markdown: str


def _measure_tts(runtime: Runtime, problems: Sequence[Problem], config: SearchConfig) -> dict[str, Any]:
    cache = ScoreCache()
    before = RunCounters.read(runtime, cache)
    start = time.perf_counter()
    results = run_search(runtime, problems, config, cache=cache)
    seconds = time.perf_counter() - start
    work = RunCounters.read(runtime, cache) - before
    return {**throughput(results, seconds, work), "accuracy": accuracy(results)["accuracy"]}


def _measure_baseline(models: HFModels, problems: Sequence[Problem], config: SearchConfig) -> dict[str, Any]:
    start = time.perf_counter()
    results = run_baseline(models, problems, config)
    seconds = time.perf_counter() - start
    measured = throughput(results, seconds, _ZERO)
    for only_tts in ("prefix_hit_rate", "score_cache", "engine"):
        measured.pop(only_tts)
    return {**measured, "accuracy": accuracy(results)["accuracy"]}


def _vllm_variants(bench: SearchBench, problems: Sequence[Problem], config: SearchConfig,
                   models: HFModels | None, log: Callable[[str], None]) -> tuple[dict, Callable[[], None]]:
    """tts on vLLM, and search-and-learn's algorithm with its generator on vLLM and its PRM
    on HF (one problem at a time); the second callable shuts their engines down."""
    from evals.bench_vllm import run_sal_vllm
    from tts_runtime.cohost.vllm_engine import VllmEngine

    runtime = Runtime(*_specs(bench), memory=bench.memory, backend="vllm")
    models = models or HFModels.load(bench.generator, bench.prm, runtime.generator.dtype)
    # Its own engine, as large as tts's vLLM generator, so neither inherits the other's cache.
    generator = VllmEngine(bench.generator, kv_cache_bytes=runtime.generator.kv_cache_bytes)

    def sal() -> dict:
        start = time.perf_counter()
        results = run_sal_vllm(generator, models, problems, config)
        measured = throughput(results, time.perf_counter() - start, _ZERO)
        for only_tts in ("prefix_hit_rate", "score_cache", "engine"):
            measured.pop(only_tts)
        return {**measured, "accuracy": accuracy(results)["accuracy"]}

    def shutdown() -> None:
        runtime.shutdown()
        generator.shutdown()

    variants = {_TTS_VLLM: _logged(log, "tts on vLLM", lambda: _measure_tts(runtime, problems, config)),
                _SAL_VLLM: _logged(log, "search-and-learn: generator on vLLM, PRM on HF re-encoding", sal)}
    return variants, shutdown


def _memory_for_every_runtime(bench: SearchBench) -> MemoryConfig:
    """On CPU the bench's runtimes (tts; tts on torch's kernels; tts on vLLM and
    search-and-learn's vLLM generator) live at once, each with the budget, and the kernel
    commits their KV caches as they fill: together they must fit in the memory free now,
    or the run is killed minutes in. The default budget is divided among them; a set one
    that does not fit is a one-line error."""
    if resolve_device("auto").type != "cpu":
        return bench.memory
    runtimes = 1 + bench.torch_kernels + 2 * bench.vllm
    free = device_memory_info("cpu").free
    if free is None:
        return bench.memory
    fitting = free * 3 // 4 // runtimes
    if bench.memory.device_memory is None:
        return replace(bench.memory, device_memory=min(DEFAULT_CPU_BUDGET, fitting))
    if bench.memory.device_memory * runtimes > free:
        raise ConfigError(f"this bench holds {runtimes} runtimes of --device-memory "
                          f"{format_bytes(bench.memory.device_memory)} at once, more than the "
                          f"{format_bytes(free)} of memory free; pass --device-memory "
                          f"{size_option(fitting)} or less")
    return bench.memory


def _specs(bench: SearchBench) -> tuple[ModelSpec, ModelSpec]:
    return ModelSpec(bench.generator, bench.dtype), ModelSpec(bench.prm, bench.dtype)


def _logged(log: Callable[[str], None], label: str, measure: Callable[[], dict]) -> Callable[[], dict]:
    def run() -> dict:
        log(f"running {label} ...")
        return measure()
    return run


_RATIO_KEYS = ("problems_per_min", "generator_tokens_per_s", "prm_tokens_per_s")


def _ratios(median: dict[str, dict[str, float]]) -> dict[str, dict]:
    """The medians of each variant over the baselines that ran: the plain HF baseline, tts on
    torch's kernels and search-and-learn on vLLM."""
    ratios: dict[str, dict] = {}
    if "baseline" in median:
        ratios["ratio"] = {label: {key: _ratio(median[label][key], median["baseline"][key]) for key in _RATIO_KEYS}
                           for label in median if label != "baseline"}
    if _TORCH_KERNELS in median:
        ratios["ratio_to_torch_kernels"] = {key: _ratio(median["tts"][key], median[_TORCH_KERNELS][key])
                                            for key in _RATIO_KEYS}
    if _SAL_VLLM in median:
        # search-and-learn on vLLM is the configuration users run today: the baseline to beat.
        ratios["ratio_to_sal_vllm"] = {label: _ratio(median[label]["problems_per_min"],
                                                     median[_SAL_VLLM]["problems_per_min"])
                                       for label in median if label != _SAL_VLLM}
    return ratios


def bench_search(bench: SearchBench, *, command: Sequence[str],
                 log: Callable[[str], None] = print) -> BenchReport:
    config = SearchConfig(**{**bench.config.to_dict(), "method": "beam"})
    problems = load_problems(DatasetConfig(dataset_path=bench.dataset_path, limit=bench.limit))
    bench = replace(bench, memory=_memory_for_every_runtime(bench))
    log(f"loading models for {len(problems)} problems ...")
    runtime = Runtime(*_specs(bench), memory=bench.memory, parallel=bench.parallel)
    variants = {"tts": _logged(log, f"tts (problem batch {config.problem_batch})",
                               lambda: _measure_tts(runtime, problems, config))}
    if bench.torch_kernels:
        before = Runtime(*_specs(bench), memory=bench.memory, parallel=bench.parallel,
                         engine_config=EngineConfig(attention_backend="torch", linear_backend="torch",
                                                    cpu_fused_ops=False))
        variants[_TORCH_KERNELS] = _logged(log, "tts on torch's kernels (attention, linear, elementwise ops)",
                                           lambda: _measure_tts(before, problems, config))
    if config.problem_batch > 1 and bench.batch_one:
        # The engine alone, one problem at a time like the baseline: splits the speed-up into
        # the engine's share and problem batching's.
        one = SearchConfig(**{**config.to_dict(), "problem_batch": 1})
        variants[_BATCH_ONE] = _logged(log, "tts (problem batch 1)", lambda: _measure_tts(runtime, problems, one))
    if bench.baseline:
        models = HFModels.load(bench.generator, bench.prm, runtime.generator.dtype)
        variants["baseline"] = _logged(log, "the plain HF baseline", lambda: _measure_baseline(models, problems, config))
    stop_vllm = None
    if bench.vllm:
        more, stop_vllm = _vllm_variants(bench, problems, config, models if bench.baseline else None, log)
        variants.update(more)
    rounds = SideBySide("search")
    try:
        rounds.run(variants, bench.rounds)
    finally:
        runtime.shutdown()
        if bench.torch_kernels:
            before.shutdown()
        if stop_vllm is not None:
            stop_vllm()
    data = {
        "benchmark": "search", "problems": len(problems), "rounds": bench.rounds,
        "config": config.to_dict(),
        "models": {"generator": bench.generator, "prm": bench.prm, "dtype": str(runtime.generator.dtype)},
        "memory_plan": runtime.plan.to_dict(),
        "pipeline": {"pp": bench.parallel.pp_size,
                     "layers_per_stage": {key: [len(r) for r in ranges]
                                          for key, ranges in runtime.pipeline.layers.items()}}
        if runtime.pipeline is not None else None,
        **environment(runtime.generator.device), "command": list(command),
        "median": {label: {key: rounds.median(label, key) for key, _, _ in _ROWS} for label in rounds.runs},
        "rounds_data": rounds.runs,
    }
    data.update(_ratios(data["median"]))
    report = BenchReport(data, _markdown(data))
    bench.out_dir.mkdir(parents=True, exist_ok=True)
    (bench.out_dir / "search.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (bench.out_dir / "search.md").write_text(report.markdown, encoding="utf-8")
    return report


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


def _pipeline_lines(pipeline: dict[str, Any] | None) -> list[str]:
    if pipeline is None:
        return []
    split = ", ".join(f"{key} {'+'.join(map(str, counts))}" for key, counts in pipeline["layers_per_stage"].items())
    return ["", f"tts ran on {pipeline['pp']} pipeline stages (layers per stage: {split})."]


def _markdown(data: dict[str, Any]) -> str:
    config, median = data["config"], data["median"]
    labels = list(median)  # tts, tts-batch-1 (when the batch is > 1), baseline: the run order
    ratios = data.get("ratio", {})
    header = {"tts": f"tts (batch {config['problem_batch']})", _BATCH_ONE: "tts (batch 1)", "baseline": "HF baseline",
              _TTS_VLLM: f"tts on vLLM (batch {config['problem_batch']})",
              _SAL_VLLM: "search-and-learn: vLLM generator, HF PRM",
              _TORCH_KERNELS: f"tts, torch kernels (batch {config['problem_batch']})"}
    ratio_labels = [label for label in labels if label in ratios]
    lines = [
        "# Search benchmark: tts vs plain HF beam search",
        "",
        f"Beam search n={config['n']}, M={config['beam_width']}, {config['num_iterations']} iterations, "
        f"{config['max_step_tokens']} tokens per step, last iteration "
        f"{'to the end (' + str(config['max_tokens']) + ' tokens)' if config['eos_sampling'] else 'one more step'}, "
        f"T={config['temperature']}, on the first {data['problems']} MATH-500 problems; generator "
        f"`{data['models']['generator']}`, PRM `{data['models']['prm']}`, "
        f"{data['models'].get('dtype', 'torch.float32').removeprefix('torch.')}. tts keeps "
        f"{config['problem_batch']} searches in flight (and, in the batch-1 column, one); the baseline runs one "
        f"problem at a time (HF `generate`, whole-sequence PRM forwards with `logits_to_keep=1`). Medians over "
        f"{data['rounds']} round(s); in each round the columns run one after another in this order.",
        *_pipeline_lines(data.get("pipeline")),
        "",
        "| " + " | ".join(["metric", *(header[label] for label in labels),
                           *(f"{header[label]} / baseline" for label in ratio_labels)]) + " |",
        "|---|" + "---:|" * (len(labels) + len(ratio_labels)),
    ]
    for key, label, fmt in _ROWS:
        cells = [fmt.format(median[side][key]) for side in labels]
        cells += [_times(ratios[side].get(key)) for side in ratio_labels]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    tts_rounds = data["rounds_data"]["tts"]
    hits = tts_rounds[-1]["prefix_hit_rate"]
    cache = tts_rounds[-1]["score_cache"]
    lines += [
        "",
        f"tts prefix-cache hit rate (share of prompt tokens served from cache): generator "
        f"{hits['generator']:.1%}, PRM {hits['prm']:.1%}; score-cache hit rate {cache['hit_rate']:.1%} "
        f"({cache['hits']} hits, {cache['misses']} misses). Last round, batch {config['problem_batch']}.",
        "",
        *_sal_vllm_lines(data, header),
        *_torch_kernels_lines(data),
        "Machine: " + ", ".join(f"{k} {v}" for k, v in data["machine"].items() if v is not None) + ". "
        "Versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()) + ".",
        "",
        "Re-run with:",
        "",
        "```",
        shlex.join(data["command"]),
        "```",
        "",
    ]
    return "\n".join(lines)


def _sal_vllm_lines(data: dict[str, Any], header: dict[str, str]) -> list[str]:
    ratios = data.get("ratio_to_sal_vllm")
    if not ratios:
        return []
    cells = ", ".join(f"{header[label]} {_times(ratio)}" for label, ratio in ratios.items())
    return [f"Problems/min against search-and-learn's configuration (generator on vLLM, PRM on HF re-encoding, "
            f"one problem at a time; vLLM settings in docs/vllm.md): {cells}.", ""]


def _torch_kernels_lines(data: dict[str, Any]) -> list[str]:
    ratios = data.get("ratio_to_torch_kernels")
    if not ratios:
        return []
    return ["tts (in-place CPU attention kernel with cascade, projections on oneDNN) over tts on torch's kernels "
            "(each context copied out of the paged cache per layer and step, F.linear): problems/min "
            f"{_times(ratios['problems_per_min'])}, generator tokens/s {_times(ratios['generator_tokens_per_s'])}, "
            f"PRM tokens/s {_times(ratios['prm_tokens_per_s'])}.", ""]


def _times(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio else ""
