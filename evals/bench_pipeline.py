"""`tts bench pipeline`: the pipelined engine core against one process, side by side.

Variants (`VARIANTS`): PP1 with 1 and with 2 torch threads in the driver, PP2 with the
sarathi and with the throttle scheduler (one torch thread per stage), PP2 throttle
with each SiPipe switch off in turn, and PP2 throttle with activations over gloo. Workloads: (a) generate, bench_engine's prompts x new
tokens at T=0.8 ignoring EOS; (b) score, bench_engine's PRM workload (beams x steps on one
MATH-500 question, iteration by iteration); (c) search, a short beam search on MATH-500
problems through `Runtime` (problems/min). Each workload builds its variants once, runs
them in alternating rounds (A, B, C, ..., A, B, C, ...) and reports medians; the
engines of a workload are shut down before the next workload builds its own (memory).

Per run, the stage timelines (`PipelineGroup.trace`, one perf_counter clock) are cut to
the run's window: busy = compute, idle = the rest of a stage's span between its first
and last event, wait = time a stage spent receiving its input (the handoff). Every run
starts with a cold prefix cache, as bench_engine's fresh engines do.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from evals.bench_engine import EngineBenchConfig, _beam_steps, _generate_prompts, _score_queries
from memory.split import MemoryConfig
from search.config import SearchConfig
from search.driver import run_search
from search.score_cache import ScoreCache
from tts_runtime.cohost.runtime import Runtime
from tts_runtime.config import (CacheConfig, ConfigError, EngineConfig, ParallelConfig, SchedulerConfig,
                                 default_block_size)
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import SamplingParams
from tts_runtime.executor.pipeline.pipeline import PipelineGroup, StageModel
from tts_runtime.executor.pipeline.stage_messages import TraceDump
from tts_runtime.models.loader import LoadedModel, load_model
from tts_runtime.runs.datasets import DatasetConfig, load_problems
from tts_runtime.runs.environment import machine_info
from tts_runtime.models.registry import DEFAULT_GENERATOR, DEFAULT_PRM
from tts_runtime.options import comma_list, option

WORKLOADS = ("generate", "score", "search")


@dataclass(frozen=True)
class Variant:
    label: str
    pp: int
    threads: int  # PP1: torch threads of the driver; PP2: per stage (the driver gets 1)
    policy: str = "sarathi"
    sample_on_driver: bool = True
    token_safe: bool = True
    structure_aware: bool = True
    transport: str = "auto"

    def engine_config(self, cache: CacheConfig = CacheConfig(), attention_backend: str = "auto") -> EngineConfig:
        parallel = ParallelConfig(self.pp, transport=self.transport,
                                  threads_per_stage=self.threads if self.pp > 1 else None,
                                  sample_on_driver=self.sample_on_driver, token_safe=self.token_safe,
                                  structure_aware=self.structure_aware)
        return EngineConfig(cache=cache, scheduler=SchedulerConfig(policy=self.policy), parallel=parallel,
                            device="cpu", attention_backend=attention_backend)

    @property
    def driver_threads(self) -> int:
        return self.threads if self.pp == 1 else 1


PP2_THROTTLE = Variant("pp2 throttle", 2, 1, "throttle")
VARIANTS = (
    Variant("pp1 1 thread", 1, 1),
    Variant("pp1 2 threads", 1, 2),
    Variant("pp2 sarathi", 2, 1),
    PP2_THROTTLE,
    replace(PP2_THROTTLE, label="pp2 throttle, sample_on_driver off", sample_on_driver=False),
    replace(PP2_THROTTLE, label="pp2 throttle, token_safe off", token_safe=False),
    replace(PP2_THROTTLE, label="pp2 throttle, structure_aware off", structure_aware=False),
    replace(PP2_THROTTLE, label="pp2 throttle, gloo transport", transport="gloo"),
)
SWITCH_VARIANTS = tuple(v.label for v in VARIANTS[4:])


@dataclass(frozen=True)
class PipelineBenchConfig:
    generator: str = DEFAULT_GENERATOR
    prm: str = DEFAULT_PRM
    num_prompts: int = option(32, "Generate workload: prompts.", at_least=1)
    new_tokens: int = option(64, "Generate workload: new tokens per prompt.", at_least=1)
    beams: int = option(16, "Score workload: beams.", at_least=1)
    steps: int = option(8, "Score workload: steps per beam.", at_least=1)
    search_problems: int = option(2, "Search workload: MATH-500 problems.", at_least=1)
    search: SearchConfig = field(default_factory=lambda: SearchConfig(
        method="beam", n=4, beam_width=2, num_iterations=3, max_step_tokens=48, max_tokens=64, problem_batch=2))
    search_memory: str | int = 5 << 29  # 2.5 GiB per runtime (the shared box's memory)
    rounds: int = option(3, "Alternating rounds of every variant; medians.", at_least=1)
    workloads: tuple[str, ...] = option(WORKLOADS, f"Comma-separated: {', '.join(WORKLOADS)}.",
                                        parse=comma_list(str, "workloads"))
    # The SiPipe switch-off variants run on the generate workload only (memory: each is
    # one more pair of stage processes).
    switches: bool = option(True, "Also PP2 throttle with each SiPipe switch off (generate).")
    attention_backend: str = "auto"  # every variant alike; "torch" skips building the C++ kernel
    out_dir: Path = option(Path("docs/benchmarks"), "Where pipeline.json/md and pipeline_trace.json go.")

    def __post_init__(self) -> None:
        unknown = set(self.workloads) - set(WORKLOADS)
        if unknown or not self.workloads:
            raise ConfigError(f"unknown workload(s) {', '.join(sorted(unknown)) or '(none)'}; "
                              f"choose from {', '.join(WORKLOADS)}")


# -- one run's measurements ------------------------------------------------------------------
@dataclass
class StageWindow:
    """One stage's events inside one run's window."""

    stage: int
    events: list[tuple[str, int, int, float, float]]

    def totals(self) -> dict[str, float]:
        span = max(e[4] for e in self.events) - min(e[3] for e in self.events) if self.events else 0.0
        busy = sum(e[4] - e[3] for e in self.events if e[0] == "compute")
        waits = [e[4] - e[3] for e in self.events if e[0] == "wait"]
        return {"busy": busy / span if span else 0.0, "idle": 1 - busy / span if span else 0.0,
                "wait_s": sum(waits), "mean_wait_ms": 1e3 * statistics.mean(waits) if waits else 0.0,
                "microbatches": len(waits)}


def _windows(group: PipelineGroup, start: float, end: float) -> list[StageWindow]:
    dumps: list[TraceDump] = group.trace()
    return [StageWindow(d.stage, [e for e in d.events if e[3] >= start and e[4] <= end]) for d in dumps]


def _cold(engines: list[Engine]) -> None:
    """Forget cached prefixes so every round starts like a fresh engine."""
    for engine in engines:
        engine.blocks.evict_cached(engine.blocks.num_cached_free_blocks)


def _measure(variant: Variant, engines: list[Engine], group: PipelineGroup | None,
             work: Callable[[], dict[str, float]]) -> dict[str, Any]:
    _cold(engines)
    torch.set_num_threads(variant.driver_threads)
    marks = [len(e.stats.microbatch_tokens) for e in engines]
    start = time.perf_counter()
    metrics = work()
    end = time.perf_counter()
    metrics["seconds"] = end - start
    metrics["microbatch_tokens"] = [t for e, m in zip(engines, marks) for t in e.stats.microbatch_tokens[m:]]
    metrics["in_flight"] = [d for e, m in zip(engines, marks) for d in e.stats.in_flight_at_launch[m:]]
    metrics["stages"] = _windows(group, start, end) if group is not None else []
    layers = group.layers if group is not None else {}
    metrics["layers_per_stage"] = {key: [len(r) for r in ranges] for key, ranges in layers.items()}
    return metrics


# -- workloads ---------------------------------------------------------------------------------
def _blocks_for(lengths: list[int], block_size: int = default_block_size("cpu")) -> int:
    """KV sized to the workload (every sequence at its longest, plus slack): no preemption,
    and no idle gigabyte per engine on a shared box."""
    return sum(-(-n // block_size) for n in lengths) + 64


def _generate_work(engine: Engine, prompts: list[list[int]], new_tokens: int) -> Callable[[], dict]:
    params = SamplingParams(temperature=0.8, max_tokens=new_tokens, ignore_eos=True)

    def run() -> dict:
        outputs = engine.generate(prompts, params)
        return {"tokens": sum(len(o.completions[0].token_ids) for o in outputs)}
    return run


def _score_work(engine: Engine, queries) -> Callable[[], dict]:
    def run() -> dict:
        before = engine.stats.computed_tokens
        for per_iteration in queries:  # iteration by iteration, like beam search
            engine.score([q.token_ids for q in per_iteration], [q.score_params() for q in per_iteration])
        return {"tokens": engine.stats.computed_tokens - before}
    return run


def _search_work(runtime: Runtime, problems, config: SearchConfig) -> Callable[[], dict]:
    def run() -> dict:
        before = runtime.generator.stats.generated_tokens
        run_search(runtime, problems, config, cache=ScoreCache())
        return {"tokens": runtime.generator.stats.generated_tokens - before, "problems": len(problems)}
    return run


@dataclass
class Built:
    """A variant's engines, kept alive across rounds; PP1 variants share theirs."""

    engines: list[Engine]
    group: PipelineGroup | None
    work: Callable[[], dict]
    close: Callable[[], None]


def _build_engines(variants: list[Variant], loaded: LoadedModel, cache: CacheConfig, attention_backend: str,
                   work: Callable[[Engine], Callable[[], dict]], samples_full_vocabulary: bool = True
                   ) -> dict[str, Built]:
    """`samples_full_vocabulary` False: the engine only scores, so the stage split does not
    count a full-vocabulary head on the last stage (as a runtime's PRM is split)."""
    built: dict[str, Built] = {}
    shared: dict[EngineConfig, Built] = {}
    for variant in variants:
        config = variant.engine_config(cache, attention_backend)
        if config not in shared:
            group = PipelineGroup([StageModel.of("model", loaded, cache.num_blocks, samples_full_vocabulary)],
                                  config) if variant.pp > 1 else None
            engine = Engine(loaded.name, config, loaded=loaded,
                            executor=group.executor("model", owns_group=True) if group is not None else None)
            shared[config] = Built([engine], group, work(engine), engine.shutdown)
        built[variant.label] = shared[config]
    return built


def _build_runtimes(variants: list[Variant], bench: PipelineBenchConfig, problems) -> dict[str, Built]:
    device = torch.device("cpu")
    generator = load_model(bench.generator, torch.float32, device)
    prm = load_model(bench.prm, torch.float32, device)
    memory = MemoryConfig(device_memory=bench.search_memory)
    built: dict[str, Built] = {}
    shared: dict[EngineConfig, Built] = {}
    profiles = None
    for variant in variants:
        config = variant.engine_config(attention_backend=bench.attention_backend)
        if config not in shared:
            runtime = Runtime(generator, prm, memory=memory, engine_config=config, profiles=profiles)
            profiles = runtime.profiles
            shared[config] = Built([runtime.generator, runtime.prm], runtime.pipeline,
                                   _search_work(runtime, problems, bench.search), runtime.shutdown)
        built[variant.label] = shared[config]
    return built


def _run_rounds(built: dict[str, Built], variants: list[Variant], rounds: int,
                log: Callable[[str], None]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {v.label: [] for v in variants}
    for round_ in range(rounds):
        for variant in variants:
            b = built[variant.label]
            metrics = _measure(variant, b.engines, b.group, b.work)
            runs[variant.label].append(metrics)
            log(f"  round {round_ + 1} {variant.label}: {metrics['tokens'] / metrics['seconds']:.1f} tok/s "
                f"({metrics['seconds']:.1f} s)")
    return runs


def _close(built: dict[str, Built]) -> None:
    for closer in {id(b): b.close for b in built.values()}.values():
        closer()


def _variants(labels: tuple[str, ...]) -> list[Variant]:
    return [v for v in VARIANTS if v.label in labels]


# -- summarising -------------------------------------------------------------------------------
def _summarise(runs: list[dict], unit: str) -> dict[str, Any]:
    rates = [r["tokens"] / r["seconds"] for r in runs]
    tokens = [t for r in runs for t in r["microbatch_tokens"]]
    depth = [d for r in runs for d in r["in_flight"]]
    row: dict[str, Any] = {
        "tokens_per_s": statistics.median(rates), "tokens_per_s_each_round": [round(x, 1) for x in rates],
        "seconds": statistics.median(r["seconds"] for r in runs),
        "mean_in_flight": statistics.mean(depth) if depth else 0.0,
        "microbatch_tokens_min_median_max": [min(tokens), statistics.median(tokens), max(tokens)] if tokens else [],
        "stages": [],
        "layers_per_stage": runs[0]["layers_per_stage"],
    }
    if unit == "problems/min":
        row["problems_per_min"] = statistics.median(60 * r["problems"] / r["seconds"] for r in runs)
    for stage in range(len(runs[0]["stages"])):
        per_round = [r["stages"][stage].totals() for r in runs]
        row["stages"].append({key: statistics.median(t[key] for t in per_round)
                              for key in ("busy", "idle", "wait_s", "mean_wait_ms", "microbatches")})
    return row


def _table_row(workload: str, label: str, row: dict, unit: str) -> dict[str, str]:
    rate = f"{row['problems_per_min']:.2f} problems/min" if unit == "problems/min" else f"{row['tokens_per_s']:.1f} tokens/s"
    spread = row["microbatch_tokens_min_median_max"]
    stages = row["stages"]
    return {
        "workload": workload, "variant": label, "rate": rate,  # one column for every workload's unit
        "busy per stage": " / ".join(f"{s['busy']:.0%}" for s in stages) or "-",
        "idle per stage": " / ".join(f"{s['idle']:.0%}" for s in stages) or "-",
        "mean wait per microbatch (ms)": " / ".join(f"{s['mean_wait_ms']:.1f}" for s in stages) or "-",
        "layers per stage": ", ".join(f"{key} {'+'.join(map(str, counts))}"
                                      for key, counts in row["layers_per_stage"].items()) or "-",
        "mean in flight": f"{row['mean_in_flight']:.2f}",
        "tokens per microbatch min/median/max": "/".join(f"{x:.0f}" for x in spread),
    }


def _targets(generate: dict[str, dict]) -> list[dict[str, str]]:
    if not {"pp2 throttle", "pp2 sarathi", "pp1 2 threads"} <= set(generate):
        return []
    throttle = generate["pp2 throttle"]
    vs_sarathi = throttle["tokens_per_s"] / generate["pp2 sarathi"]["tokens_per_s"]
    vs_pp1 = throttle["tokens_per_s"] / generate["pp1 2 threads"]["tokens_per_s"]
    worst_idle = max(s["idle"] for s in throttle["stages"])
    return [
        {"target": "PP2 throttle >= 1.3x PP2 sarathi (generate)", "measured": f"{vs_sarathi:.2f}x",
         "met": "yes" if vs_sarathi >= 1.3 else "MISSED"},
        {"target": "idle < 15% per stage (PP2 throttle, generate)",
         "measured": " / ".join(f"{s['idle']:.0%}" for s in throttle["stages"]),
         "met": "yes" if worst_idle < 0.15 else "MISSED"},
        {"target": "PP2 throttle >= PP1 with 2 threads (generate)", "measured": f"{vs_pp1:.2f}x",
         "met": "yes" if vs_pp1 >= 1.0 else "MISSED"},
    ]


# -- the Chrome trace --------------------------------------------------------------------------
def chrome_trace(stages: list[StageWindow]) -> dict[str, Any]:
    """Perfetto / chrome://tracing: one process per stage, prepares on their own thread
    (they overlap compute when token-safe execution is on), times in microseconds."""
    origin = min((e[3] for s in stages for e in s.events), default=0.0)
    events: list[dict[str, Any]] = []
    for s in stages:
        events.append({"name": "process_name", "ph": "M", "pid": s.stage, "args": {"name": f"stage {s.stage}"}})
        for what, microbatch, version, start, end in s.events:
            events.append({"name": f"{what} mb{microbatch}", "cat": what, "ph": "X", "pid": s.stage,
                           "tid": 1 if what == "prepare" else 0, "ts": (start - origin) * 1e6,
                           "dur": (end - start) * 1e6, "args": {"microbatch": microbatch, "buffer": version}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


# -- the benchmark -----------------------------------------------------------------------------
@dataclass
class PipelineReport:
    summary: dict[str, Any]
    json_path: Path
    markdown_path: Path
    trace_path: Path | None


def _warm(built: dict[str, Built], prompts: list[list[int]]) -> None:
    """First-call costs stay out of round 1."""
    for b in {id(b): b for b in built.values()}.values():
        _generate_work(b.engines[0], prompts[:2], 2)()


def _generate(bench: PipelineBenchConfig, variants: list[Variant], log) -> dict[str, list[dict]]:
    """The base variants side by side; then each SiPipe switch-off pipeline alone beside the
    PP2 throttle one (memory: at most two pipelines alive), compared within its own rounds."""
    loaded = load_model(bench.generator, torch.float32, torch.device("cpu"))
    prompts = _generate_prompts(loaded, bench.num_prompts)
    cache = CacheConfig(num_blocks=_blocks_for([len(p) + bench.new_tokens for p in prompts]))

    def work(engine: Engine) -> Callable[[], dict]:
        return _generate_work(engine, prompts, bench.new_tokens)

    base = [v for v in variants if v.label not in SWITCH_VARIANTS]
    built = _build_engines(base, loaded, cache, bench.attention_backend, work)
    try:
        _warm(built, prompts)
        runs = _run_rounds(built, base, bench.rounds, log)
        throttle = built[PP2_THROTTLE.label]
        _close({label: b for label, b in built.items() if b is not throttle})
        for switch in (v for v in variants if v.label in SWITCH_VARIANTS):
            off = _build_engines([switch], loaded, cache, bench.attention_backend, work)
            try:
                _warm(off, prompts)
                pair = _run_rounds({**off, PP2_THROTTLE.label: throttle}, [PP2_THROTTLE, switch], bench.rounds, log)
            finally:
                _close(off)
            runs[reference_label(switch.label)] = pair[PP2_THROTTLE.label]
            runs[switch.label] = pair[switch.label]
        return runs
    finally:
        _close(built)  # shutting down twice is a no-op


def reference_label(switch_label: str) -> str:
    return f"pp2 throttle (beside {switch_label.split(', ')[1]})"


def _score(bench: PipelineBenchConfig, variants: list[Variant], log) -> dict[str, list[dict]]:
    question, beams = _beam_steps(EngineBenchConfig(generator=bench.generator, beams=bench.beams, steps=bench.steps))
    loaded = load_model(bench.prm, torch.float32, torch.device("cpu"))
    queries = _score_queries(loaded, question, beams, bench.steps)
    cache = CacheConfig(num_blocks=_blocks_for([len(q.token_ids) for q in queries[-1]]))
    built = _build_engines(variants, loaded, cache, bench.attention_backend, lambda e: _score_work(e, queries),
                           samples_full_vocabulary=False)
    try:
        return _run_rounds(built, variants, bench.rounds, log)
    finally:
        _close(built)


def _search(bench: PipelineBenchConfig, variants: list[Variant], log) -> dict[str, list[dict]]:
    problems = load_problems(DatasetConfig(limit=bench.search_problems))
    built = _build_runtimes(variants, bench, problems)
    try:
        return _run_rounds(built, variants, bench.rounds, log)
    finally:
        _close(built)


def bench_pipeline(bench: PipelineBenchConfig, *, command: str, log: Callable[[str], None] = print) -> PipelineReport:
    base = [v.label for v in VARIANTS[:4]]
    plan = {"generate": (_generate, base + (list(SWITCH_VARIANTS) if bench.switches else []), "tokens/s"),
            "score": (_score, base, "tokens/s"),
            "search": (_search, base, "problems/min")}
    summary: dict[str, Any] = {"config": {k: (v.to_dict() if isinstance(v, SearchConfig) else v)
                                          for k, v in vars(bench).items() if k != "out_dir"}, "workloads": {}}
    table: list[dict[str, str]] = []
    trace: dict[str, Any] | None = None
    for workload in [w for w in WORKLOADS if w in bench.workloads]:
        fn, labels, unit = plan[workload]
        log(f"{workload}: {', '.join(labels)}")
        runs = fn(bench, _variants(tuple(labels)), log)
        rows = {label: _summarise(label_runs, unit) for label, label_runs in runs.items()}
        summary["workloads"][workload] = rows
        table += [_table_row(workload, label, row, unit) for label, row in rows.items()]
        if workload == "generate" and "pp2 throttle" in runs:
            trace = chrome_trace(runs["pp2 throttle"][-1]["stages"])
        summary["targets"] = _targets(summary["workloads"].get("generate", {}))
        # Written after every workload: a long run cut short keeps what it measured.
        report = _write(bench, command, summary, table, summary["targets"], trace)
    return report


def _write(bench: PipelineBenchConfig, command: str, summary: dict, table: list[dict], targets: list[dict],
           trace: dict | None) -> PipelineReport:
    out = bench.out_dir
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    json_path, md_path = out / "pipeline.json", out / "pipeline.md"
    json_path.write_text(json.dumps({"title": "Pipeline parallelism", "command": command, "machine": machine,
                                     "summary": summary}, indent=2))
    trace_path = None
    if trace is not None:
        trace_path = out / "pipeline_trace.json"
        trace_path.write_text(json.dumps(trace))
    lines = ["# Pipeline parallelism: PP1 vs PP2 (sarathi, throttle, SiPipe switches)", "",
             f"Command: `{command}`", "",
             "Machine: " + ", ".join(f"{k} {v}" for k, v in machine.items() if v is not None), "",
             *_markdown_table(table), "", "Targets:", "", *_markdown_table(targets), "",
             *[f"- {n}" for n in _notes(bench, summary)]]
    md_path.write_text("\n".join(lines) + "\n")
    return PipelineReport(summary, json_path, md_path, trace_path)


def _markdown_table(rows: list[dict[str, str]]) -> list[str]:
    if not rows:
        return ["(none)"]
    keys = list(rows[0])
    return ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys),
            *["| " + " | ".join(str(row[k]) for k in keys) + " |" for row in rows]]


def _switch_notes(rows: dict[str, dict]) -> list[str]:
    notes = []
    for label in SWITCH_VARIANTS:
        if label in rows:
            ratio = rows[label]["tokens_per_s"] / rows[reference_label(label)]["tokens_per_s"]
            notes.append(f"{label}: {ratio:.2f}x the tokens/s of PP2 throttle in the same rounds.")
    return notes


def _notes(bench: PipelineBenchConfig, summary: dict) -> list[str]:
    s = bench.search
    return [
        f"Medians of {bench.rounds} alternating rounds (every variant of a workload once per round, in table "
        "order); each workload's engines are built once, kept across rounds, and every run starts with a cold "
        "prefix cache.",
        f"generate: {bench.num_prompts} MATH-500 prompts x {bench.new_tokens} new tokens ({bench.generator}, "
        f"float32, attention backend {bench.attention_backend}), T=0.8, ignore_eos; tokens/s = generated tokens / wall time. score: bench_engine's PRM "
        f"workload ({bench.beams} beams x {bench.steps} steps, {bench.prm}), tokens/s = tokens through the model "
        f"/ wall time. search: beam search n={s.n} M={s.beam_width}, {s.num_iterations} iterations, step cap "
        f"{s.max_step_tokens}, on {bench.search_problems} MATH-500 problems through Runtime (generator and PRM "
        "in one pipeline group at PP2).",
        "PP1 runs in the driver with torch.set_num_threads(1 or 2); PP2 runs two stage processes of one torch "
        "thread each (threads_per_stage=1) and the driver with one thread. The SiPipe switch-off variants "
        "and the gloo-transport variant run "
        "on the generate workload only, after the base variants, each in its own rounds beside the PP2 throttle "
        "pipeline (its reference row): at most two pipelines are alive at once on this 24 GiB shared box.",
        *_switch_notes(summary["workloads"].get("generate", {})),
        "layers per stage: the default split, which balances each stage's measured time "
        "(executor/layer_costs.py: one probe decode step timed layer by layer, output head included, at the "
        "stage's thread count).",
        "busy = a stage's compute time / its span from first to last event in the run; idle = the rest "
        "(bubbles). wait = the time a stage spends getting its input: for stage 0 that is the embedding lookup, "
        "for later stages the activation handoff (waiting for the previous stage included).",
        "The machine was shared with other engineers' tests and benchmarks (2 cores): absolute rates vary "
        "between rounds; compare the ratios of variants within this run.",
        "pipeline_trace.json: the last generate round of PP2 throttle as a Chrome trace (open in "
        "https://ui.perfetto.dev); one process per stage, prepares on thread 1.",
    ]
