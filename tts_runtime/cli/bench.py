"""`tts bench ...`: the benchmarks under evals/, each writing JSON + markdown under docs/benchmarks/.

The options a benchmark shares with a run (search shape, models, memory, device ...) come from
the run configuration (cli/options.py), with the benchmark's own defaults; the rest are its knobs."""

from __future__ import annotations

import shlex
import sys
from typing import Annotated

import typer

from evals.bench_beam import BeamBenchConfig
from evals.bench_cohost import CohostBench
from evals.bench_engine import EngineBenchConfig
from evals.bench_gpu import GpuBenchConfig
from evals.bench_host import HostBench
from evals.bench_pipeline import PipelineBenchConfig
from evals.bench_scaleout import ScaleoutBench
from evals.bench_search import SearchBench, bench_search
from evals.bench_speculation import SpeculationBench
from evals.bench_startup import StartupBench
from evals.bench_tiered_kv import TieredKVBench
from tts_runtime.cli.common import check_names, console
from tts_runtime.cli.options import config_command
from tts_runtime.config import ConfigError
from tts_runtime.runs.run_config import RunConfig

bench_app = typer.Typer(help="Benchmarks (JSON + markdown under docs/benchmarks/).", no_args_is_help=True)


SEARCH_SHAPE = ("n", "beam_width", "num_iterations", "max_step_tokens", "max_tokens", "problem_batch")
# A benchmark's search: smaller than the recipe's, so that rounds of every variant fit a run.
SHORT_SEARCH = {"num_iterations": 5, "max_step_tokens": 96, "max_tokens": 256, "problem_batch": 8}


@config_command(bench_app, "search", fixed={"method": "beam"}, defaults={"limit": 20},
                only=(*SEARCH_SHAPE, "seed", "generator", "prm", "prm_format", "dataset_path", "limit",
                      "device_memory", "backend", "pp", "pp_layers", "dtype"), plan=SearchBench)
def bench_search_command(run: RunConfig, settings: dict) -> None:
    """Beam search, tts vs the plain HF baseline, side by side on the first N MATH-500 problems
    (writes search.json and search.md to --out-dir). --backend vllm adds tts on vLLM and
    search-and-learn's configuration (generator on vLLM, PRM on HF re-encoding)."""
    bench = SearchBench(config=run.search, limit=run.dataset.limit, generator=run.models.generator,
                        prm=run.models.prm, dataset_path=run.dataset.dataset_path, memory=run.memory,
                        vllm=run.backend == "vllm", parallel=run.engine.parallel, dtype=run.models.dtype, **settings)
    report = bench_search(bench, command=["tts", *sys.argv[1:]], log=console.print)
    typer.echo(report.markdown)


@config_command(bench_app, "scaleout", fixed={"method": "beam", "device": "cpu"},
                defaults={"limit": 8, "num_iterations": 5, "max_step_tokens": 64, "problem_batch": 8,
                          "device_memory": "2.5GiB"},
                only=(*SEARCH_SHAPE, "limit", "dataset_path", "device_memory"), plan=ScaleoutBench)
def bench_scaleout_command(run: RunConfig, settings: dict) -> None:
    """Problems/min on Ray: 1 and 2 replicas of 1 thread, 1 replica of 2 threads, CPU (writes
    scaleout.json/md). --device-memory is per replica."""
    from evals.bench_scaleout import bench_scaleout
    from tts_runtime.runs.scaleout import ReplicaSpec

    spec = ReplicaSpec(*run.models.specs(), run.memory, run.engine)
    bench = ScaleoutBench(spec, run.search, run.dataset.limit, dataset_path=run.dataset.dataset_path, **settings)
    path = bench_scaleout(bench,
                          command=["tts", *sys.argv[1:]], log=console.print)
    typer.echo(path.read_text())


@config_command(bench_app, "tiered-kv", fixed={"method": "beam", "eos_sampling": False},
                defaults={"limit": 4, "num_iterations": 6, "max_step_tokens": 128, "problem_batch": 4,
                          "device_memory": "2.1GiB", "memory_split": 0.1, "host_kv_memory": "1GiB"},
                only=(*SEARCH_SHAPE, "limit", "dataset_path", "device", "device_memory", "memory_split",
                      "host_kv_memory", "host_kv_prefetch"), plan=TieredKVBench)
def bench_tiered_kv_command(run: RunConfig, settings: dict) -> None:
    """Host KV tier off/on x prefix-aware ordering off/on on a memory-squeezed beam search (the
    memory sweep's workload: a step every iteration): problems/s, tokens recomputed and saved,
    bytes swapped, swap time, prefix hit rates (writes tiered_kv.json/md). --device-memory and
    --memory-split set the squeeze; --host-kv-memory the tier of the tier-on variants."""
    from evals.bench_tiered_kv import BASELINE, VARIANTS, bench_tiered_kv

    chosen = check_names(settings.pop("variants"), "variants", tuple(VARIANTS))
    bench = TieredKVBench(run.search, run.memory, run.engine.cache.host_kv_bytes, limit=run.dataset.limit,
                          prefetch=run.engine.cache.host_kv_prefetch, dataset_path=run.dataset.dataset_path,
                          device=run.engine.device, variants=tuple(dict.fromkeys([BASELINE, *chosen])), **settings)
    path = bench_tiered_kv(bench, command=["tts", *sys.argv[1:]], log=console.print)
    typer.echo(path.read_text())


@config_command(bench_app, "cohost", fixed={"method": "beam"},
                defaults={"limit": 20, **SHORT_SEARCH, "device_memory": "3GiB"},
                only=(*SEARCH_SHAPE, "seed", "limit", "dataset_path", "device", "dtype", "linear_backend",
                      "device_memory", "prm_buffer_tokens", "generator_low_water", "generator_buffer_seqs"),
                plan=CohostBench)
def bench_cohost_command(run: RunConfig, settings: dict) -> None:
    """Phase policy (alternate vs batched), overlap, speculative extension and prefix-aware ordering,
    each off and on and all together, side by side on beam search: problems/min, goodput, batch
    sizes, phase transitions, busy fractions, prefix hit rates (writes cohost.json/md). The
    batched thresholds apply to the batched variants."""
    from evals.bench_cohost import BASELINE, VARIANTS, bench_cohost

    chosen = check_names(settings["variants"], "variants", tuple(VARIANTS))
    if chosen[0] != BASELINE:
        raise ConfigError(f"--variants starts with {BASELINE} (the baseline); got '{','.join(chosen)}'")
    bench = CohostBench(config=run.search, limit=run.dataset.limit, dataset_path=run.dataset.dataset_path,
                        memory=run.memory, device=run.engine.device, dtype=run.models.dtype,
                        linear_backend=run.engine.linear_backend, thresholds=run.engine.cohost, **settings)
    path = bench_cohost(bench, command=["tts", *sys.argv[1:]], log=console.print)
    typer.echo(path.read_text())


@config_command(bench_app, "engine", only=("backend",), plan=(EngineBenchConfig, BeamBenchConfig))
def bench_engine_command(
    run: RunConfig,
    settings: tuple[dict, dict],
    workload: Annotated[str, typer.Option(help="all: generate, score and beam; generate-score: the first two; "
                                               "beam: only the beam-shaped decode; attention: one layer's "
                                               "attention at beam shapes (beam_attention.json/md).")] = "all",
) -> None:
    """Engine vs HF transformers: generate tokens/s and PRM scoring (writes engine.json/md); beam-shaped
    decode with the attention switches off and on (writes beam_decode.json/md). --backend vllm
    also runs the generate and score workloads on vLLM, in the same alternation."""
    from evals.bench_beam import run_attention_bench, run_beam_bench
    from evals.bench_engine import run_engine_bench

    if workload not in ("all", "generate-score", "beam", "attention"):
        raise ConfigError(f"unknown --workload '{workload}'; choose all, generate-score, beam or attention")
    engine, beam = settings
    command_line = shlex.join(["tts", *sys.argv[1:]])
    if workload == "attention":
        typer.echo(run_attention_bench(max(engine["repeats"], 9), command_line))
        return
    if workload in ("all", "generate-score"):
        typer.echo(run_engine_bench(EngineBenchConfig(vllm=run.backend == "vllm", **engine), command_line))
    if workload in ("all", "beam"):
        typer.echo(run_beam_bench(BeamBenchConfig(repeats=engine["repeats"], dtypes=engine["dtypes"], **beam),
                                  command_line))


@config_command(bench_app, "gpu", only=(), plan=GpuBenchConfig)
def bench_gpu_command(run: RunConfig, settings: dict) -> None:
    """Seed-model shapes on dummy weights vs HF and the roofline; needs CUDA (writes gpu.json/md)."""
    from evals.bench_gpu import run_gpu_bench

    config = GpuBenchConfig(**settings)
    typer.echo(run_gpu_bench(config, shlex.join(["tts", *sys.argv[1:]])))


@config_command(bench_app, "host", defaults={"device": "sim"}, only=("device",), plan=HostBench)
def bench_host_command(run: RunConfig, settings: dict) -> None:
    """Host time of the main job on a simulated H100 (--device sim or sim:COSTS.json; writes
    host.json/md); evals/bench_host.py."""
    from evals.bench_host import bench_host

    bench_host(HostBench(device=run.engine.device, **settings), shlex.join(["tts", *sys.argv[1:]]), log=console.print)


@config_command(bench_app, "pipeline", only=("attention_backend",), plan=PipelineBenchConfig)
def bench_pipeline_command(run: RunConfig, settings: dict) -> None:
    """PP1 (1 and 2 threads) vs PP2 (sarathi, throttle, SiPipe switches off): tokens/s, stage busy/idle,
    microbatches in flight (writes pipeline.json/md and a Chrome trace); every variant on
    --attention-backend."""
    from evals.bench_pipeline import WORKLOADS, bench_pipeline

    check_names(settings["workloads"], "workloads", WORKLOADS)
    config = PipelineBenchConfig(attention_backend=run.engine.attention_backend, **settings)
    report = bench_pipeline(config, command=shlex.join(["tts", *sys.argv[1:]]), log=console.print)
    typer.echo(report.markdown_path.read_text())


@config_command(bench_app, "speculation", fixed={"method": "beam"},
                defaults={"limit": 20, **SHORT_SEARCH, "device_memory": "3GiB"},
                only=(*SEARCH_SHAPE, "temperature", "seed", "speculative_max_tokens", "limit", "dataset_path",
                      "device", "device_memory"), plan=SpeculationBench)
def bench_speculation_command(run: RunConfig, settings: dict) -> None:
    """Speculative beam extension off vs on, side by side on beam search: problems/min, goodput,
    speculative tokens kept and discarded (writes docs/benchmarks/speculation.json/md)."""
    from evals.bench_speculation import bench_speculation

    bench = SpeculationBench(config=run.search, limit=run.dataset.limit, dataset_path=run.dataset.dataset_path,
                             memory=run.memory, device=run.engine.device, **settings)
    path = bench_speculation(bench, command=["tts", *sys.argv[1:]], log=console.print)
    typer.echo(path.read_text())


@config_command(bench_app, "startup", fixed={"method": "beam"},
                defaults={"limit": 8, "num_iterations": 5, "max_step_tokens": 96, "device": "cpu"},
                only=(*SEARCH_SHAPE, "seed", "limit", "dataset_path", "device", "device_memory", "dtype"),
                plan=StartupBench)
def bench_startup_command(run: RunConfig, settings: dict) -> None:
    """The whole main job, each run a fresh `tts beam` process, with the KV cache zeroed lazily
    (--lazy-kv-zeroing) vs eagerly: wall time, time outside the search, problems/min, peak
    memory (writes docs/benchmarks/<stem>.json/md)."""
    from evals.bench_startup import bench_startup

    path = bench_startup(StartupBench(run, **settings), command=["tts", *sys.argv[1:]], log=console.print)
    typer.echo(path.read_text())
