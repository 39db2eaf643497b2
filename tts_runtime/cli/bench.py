"""`tts bench ...`: the benchmarks under evals/, each writing JSON + markdown under docs/benchmarks/."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from evals.bench_search import SearchBench, bench_search
from memory.split import parse_size
from search.config import SearchConfig
from tts_runtime.cli.common import (COHOST, DEFAULT_GENERATOR, DEFAULT_PRM, DTYPE_HELP, SEARCH, command, console,
                                    memory_config, parse_csv)
from tts_runtime.cohost.runtime import check_backend
from tts_runtime.config import (CohostConfig, ConfigError, EngineConfig, ModelSpec, ParallelConfig, resolve_device,
                                resolve_dtype)

bench_app = typer.Typer(help="Benchmarks (JSON + markdown under docs/benchmarks/).", no_args_is_help=True)


@command(bench_app, "search")
def bench_search_command(
    limit: Annotated[int, typer.Option(help="First N MATH-500 problems.")] = 20,
    n: Annotated[int, typer.Option()] = 4,
    beam_width: Annotated[int, typer.Option()] = 4,
    num_iterations: Annotated[int, typer.Option()] = SEARCH.num_iterations,
    max_step_tokens: Annotated[int, typer.Option()] = SEARCH.max_step_tokens,
    max_tokens: Annotated[int, typer.Option(help="Token cap of the last iteration's run to the end.")] = SEARCH.max_tokens,
    problem_batch: Annotated[int, typer.Option(help="tts searches in flight, and 1 beside it (the baseline "
                                                    "does one).")] = SEARCH.problem_batch,
    seed: Annotated[int, typer.Option()] = SEARCH.seed,
    generator: Annotated[str, typer.Option()] = DEFAULT_GENERATOR,
    prm: Annotated[str, typer.Option()] = DEFAULT_PRM,
    prm_format: Annotated[Optional[str], typer.Option()] = None,
    dataset_path: Annotated[Optional[str], typer.Option()] = None,
    device_memory: Annotated[Optional[str], typer.Option()] = None,
    rounds: Annotated[int, typer.Option(help="Rounds, each running every side in turn (tts, tts batch 1, "
                                              "baseline, tts, ...); medians reported.")] = 2,
    baseline: Annotated[bool, typer.Option(help="Also run the plain HF baseline.")] = True,
    out_dir: Annotated[Path, typer.Option(help="Where search.json and search.md go.")] = Path("docs/benchmarks"),
    backend: Annotated[str, typer.Option(help="vllm: also tts on vLLM and search-and-learn's configuration "
                                              "(generator on vLLM, PRM on HF re-encoding).")] = "native",
    batch_one: Annotated[bool, typer.Option(help="Also tts at problem batch 1.")] = True,
    torch_kernels: Annotated[bool, typer.Option(help="Also tts on torch's kernels: the attention backend "
                                                     "that copies each context out of the cache, F.linear "
                                                     "and eager elementwise ops (the before of the in-place "
                                                     "kernel, oneDNN and the CPU layer ops).")] = False,
    pp: Annotated[int, typer.Option(help="tts's pipeline stages (processes).")] = 1,
    pp_layers: Annotated[Optional[str], typer.Option(help="Generator layers per stage, e.g. 16,14 "
                                                          "(default: balanced on measured time).")] = None,
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP + " Every side, the HF baseline included.")] = "auto",
) -> None:
    """Beam search, tts vs the plain HF baseline, side by side on the first N MATH-500 problems
    (writes search.json and search.md to --out-dir)."""
    check_backend(backend, "static")
    resolve_dtype(dtype, resolve_device("auto"))
    parallel = ParallelConfig(pp, tuple(parse_csv(pp_layers, "pp-layers", int) or []) or None)
    config = SearchConfig(method="beam", n=n, beam_width=beam_width, num_iterations=num_iterations,
                          max_step_tokens=max_step_tokens, max_tokens=max_tokens, problem_batch=problem_batch,
                          seed=seed, prm_format=prm_format)
    bench = SearchBench(config=config, limit=limit, generator=generator, prm=prm, dataset_path=dataset_path,
                        memory=memory_config(device_memory, 0.3, "static"), rounds=rounds, baseline=baseline,
                        out_dir=out_dir, vllm=backend == "vllm", batch_one=batch_one,
                        torch_kernels=torch_kernels, parallel=parallel, dtype=dtype)
    report = bench_search(bench, command=["tts", *sys.argv[1:]], log=console.print)
    typer.echo(report.markdown)


@command(bench_app, "scaleout")
def bench_scaleout_command(
    limit: Annotated[int, typer.Option(help="First N MATH-500 problems.")] = 8,
    n: Annotated[int, typer.Option()] = 4,
    beam_width: Annotated[int, typer.Option()] = 4,
    num_iterations: Annotated[int, typer.Option()] = 5,
    max_step_tokens: Annotated[int, typer.Option()] = 64,
    max_tokens: Annotated[int, typer.Option(help="Token cap of the last iteration's run to the end "
                                                 "(the recipe's 2048 lets one long problem set the wall "
                                                 "time of a small run).")] = 2048,
    problem_batch: Annotated[int, typer.Option(help="Searches in flight per replica.")] = 8,
    rounds: Annotated[int, typer.Option(help="Alternating rounds of the three variants; medians.")] = 2,
    dataset_path: Annotated[Optional[str], typer.Option()] = None,
    device_memory: Annotated[Optional[str], typer.Option(help="Memory budget per replica.")] = "2.5GiB",
) -> None:
    """Problems/min on Ray: 1 and 2 replicas of 1 thread, 1 replica of 2 threads, CPU (writes
    scaleout.json/md)."""
    from evals.bench_scaleout import ScaleoutBench, bench_scaleout
    from tts_runtime.runs.scaleout import ReplicaSpec

    config = SearchConfig(method="beam", n=n, beam_width=beam_width, num_iterations=num_iterations,
                          max_step_tokens=max_step_tokens, max_tokens=max_tokens, problem_batch=problem_batch)
    spec = ReplicaSpec(ModelSpec(DEFAULT_GENERATOR), ModelSpec(DEFAULT_PRM), memory_config(device_memory, 0.3, "static"),
                       EngineConfig(device="cpu"))
    path = bench_scaleout(ScaleoutBench(spec, config, limit, rounds, dataset_path),
                          command=["tts", *sys.argv[1:]], log=console.print)
    typer.echo(path.read_text())


@command(bench_app, "tiered-kv")
def bench_tiered_kv_command(
    limit: Annotated[int, typer.Option(help="First N MATH-500 problems.")] = 4,
    n: Annotated[int, typer.Option()] = 4,
    beam_width: Annotated[int, typer.Option()] = 4,
    num_iterations: Annotated[int, typer.Option()] = 6,
    max_step_tokens: Annotated[int, typer.Option()] = 128,
    max_tokens: Annotated[int, typer.Option(help="Token cap of a whole solution.")] = SEARCH.max_tokens,
    problem_batch: Annotated[int, typer.Option(help="Searches in flight.")] = 4,
    device_memory: Annotated[str, typer.Option(help="The squeeze: both models' device budget.")] = "2.1GiB",
    memory_split: Annotated[float, typer.Option(help="PRM share of the KV budget (0.1 starves the PRM's "
                                                     "pool: the memory sweep's thrashing setting).")] = 0.1,
    host_kv_memory: Annotated[str, typer.Option(help="Host KV tier per model in the tier-on variants.")] = "1GiB",
    host_kv_prefetch: Annotated[bool, typer.Option(help="Prefetch in the tier-on variants.")] = True,
    rounds: Annotated[int, typer.Option(help="Alternating rounds of the variants; medians.")] = 3,
    variants: Annotated[str, typer.Option(help="Comma list of: tier off (always run: the baseline), tier on, "
                                               "prefix order, tier on + prefix order.")]
    = "tier off,tier on,prefix order,tier on + prefix order",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda.")] = "auto",
    dataset_path: Annotated[Optional[str], typer.Option()] = None,
) -> None:
    """Host KV tier off/on x prefix-aware ordering off/on on a memory-squeezed beam search: problems/s,
    tokens recomputed and saved, bytes swapped, swap time, prefix hit rates (writes tiered_kv.json/md)."""
    from evals.bench_tiered_kv import BASELINE, VARIANTS, TieredKVBench, bench_tiered_kv

    chosen = [v.strip() for v in variants.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in VARIANTS]
    if unknown:
        raise ConfigError(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")

    config = SearchConfig(method="beam", n=n, beam_width=beam_width, num_iterations=num_iterations,
                          max_step_tokens=max_step_tokens, max_tokens=max_tokens, problem_batch=problem_batch,
                          # A step every iteration, the last one too: the memory sweep's workload.
                          eos_sampling=False)
    bench = TieredKVBench(config, memory_config(device_memory, memory_split, "static"), parse_size(host_kv_memory),
                          limit=limit, rounds=rounds, prefetch=host_kv_prefetch, dataset_path=dataset_path,
                          device=device, variants=tuple(dict.fromkeys([BASELINE, *chosen])))
    path = bench_tiered_kv(bench, command=["tts", *sys.argv[1:]], log=console.print)
    typer.echo(path.read_text())


@command(bench_app, "cohost")
def bench_cohost_command(
    limit: Annotated[int, typer.Option(help="First N MATH-500 problems.")] = 20,
    n: Annotated[int, typer.Option()] = 4,
    beam_width: Annotated[int, typer.Option()] = 4,
    num_iterations: Annotated[int, typer.Option()] = 5,
    max_step_tokens: Annotated[int, typer.Option()] = 96,
    max_tokens: Annotated[int, typer.Option(help="Token cap of the last iteration's run to the end.")] = 256,
    problem_batch: Annotated[int, typer.Option(help="Searches in flight.")] = 8,
    seed: Annotated[int, typer.Option()] = SEARCH.seed,
    rounds: Annotated[int, typer.Option(help="Alternating rounds of every variant; medians.")] = 2,
    variants: Annotated[str, typer.Option(help="Comma-separated, alternate first: alternate, batched, "
                                               "overlap, batched + overlap, speculation, prefix order, batched + prefix "
                                               "order, all.")]
    = "alternate,batched,overlap,batched + overlap,speculation,prefix order,batched + prefix order,all",
    prm_buffer_tokens: Annotated[int, typer.Option(help="Batched variants' PRM buffer.")] = COHOST.prm_buffer_tokens,
    generator_low_water: Annotated[int, typer.Option()] = COHOST.generator_low_water,
    generator_buffer_seqs: Annotated[int, typer.Option()] = COHOST.generator_buffer_seqs,
    dataset_path: Annotated[Optional[str], typer.Option()] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda ...")] = "auto",
    dtype: Annotated[str, typer.Option(help=DTYPE_HELP + " Every variant.")] = "auto",
    linear_backend: Annotated[str, typer.Option(help="CPU projections, every variant: auto, onednn, "
                                                     "prepacked, streamed, torch (see tts beam).")] = "auto",
    device_memory: Annotated[Optional[str], typer.Option(help="Memory budget for both models.")] = "3GiB",
) -> None:
    """Phase policy (alternate vs batched), overlap, speculative extension and prefix-aware ordering,
    each off and on and all together, side by side on beam search: problems/min, goodput, batch
    sizes, phase transitions, busy fractions, prefix hit rates (writes cohost.json/md)."""
    from evals.bench_cohost import BASELINE, VARIANTS, CohostBench, bench_cohost

    chosen = [name.strip() for name in variants.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in VARIANTS]
    if unknown or not chosen or chosen[0] != BASELINE:
        raise ConfigError(f"--variants takes a comma-separated list starting with {BASELINE}, from "
                          f"{', '.join(VARIANTS)}; got '{variants}'")
    config = SearchConfig(method="beam", n=n, beam_width=beam_width, num_iterations=num_iterations,
                          max_step_tokens=max_step_tokens, max_tokens=max_tokens, problem_batch=problem_batch,
                          seed=seed)
    thresholds = CohostConfig(prm_buffer_tokens=prm_buffer_tokens, generator_low_water=generator_low_water,
                              generator_buffer_seqs=generator_buffer_seqs)
    resolve_dtype(dtype, resolve_device(device))
    EngineConfig(linear_backend=linear_backend)  # an unknown backend: one line now, not after loading
    bench = CohostBench(config=config, limit=limit, rounds=rounds, dataset_path=dataset_path,
                        memory=memory_config(device_memory, 0.3, "static"), device=device, dtype=dtype,
                        linear_backend=linear_backend, thresholds=thresholds, variants=tuple(chosen))
    path = bench_cohost(bench, command=["tts", *sys.argv[1:]], log=console.print)
    typer.echo(path.read_text())


@command(bench_app, "engine")
def bench_engine_command(
    num_prompts: Annotated[int, typer.Option(help="Generate workload: prompts.")] = 64,
    new_tokens: Annotated[int, typer.Option(help="Generate workload: new tokens per prompt.")] = 128,
    beams: Annotated[int, typer.Option(help="Score workload: beams.")] = 16,
    steps: Annotated[int, typer.Option(help="Score workload: steps per beam.")] = 8,
    repeats: Annotated[int, typer.Option(help="Alternating repetitions; medians reported.")] = 3,
    dtypes: Annotated[str, typer.Option(help="Every side at each of these dtypes, e.g. float32,bfloat16 "
                                             "(beam workload: the first runs every tts variant, the others "
                                             "the oneDNN ones and, at bfloat16, the bf16-dot switch off; HF and "
                                             "vLLM run at each).")] = "float32",
    workload: Annotated[str, typer.Option(help="all: generate, score and beam; generate-score: the first two; "
                                               "beam: only the beam-shaped "
                                               "decode; attention: one layer's attention at beam "
                                               "shapes (beam_attention.json/md).")] = "all",
    beam_new_tokens: Annotated[int, typer.Option(help="Beam workload: new tokens per fork.")] = 256,
    beam_hf: Annotated[bool, typer.Option(help="Beam workload: include HF generate.")] = True,
    backend: Annotated[str, typer.Option(help="vllm: also run the generate and score workloads on vLLM, "
                                              "in the same alternation.")] = "native",
) -> None:
    """Engine vs HF transformers: generate tokens/s and PRM scoring (writes engine.json/md); beam-shaped
    decode with the attention switches off and on (writes beam_decode.json/md)."""
    from evals.bench_beam import BeamBenchConfig, run_attention_bench, run_beam_bench
    from evals.bench_engine import EngineBenchConfig, parse_dtypes, run_engine_bench

    if workload not in ("all", "generate-score", "beam", "attention"):
        raise ConfigError(f"unknown --workload '{workload}'; choose all, generate-score, beam or attention")
    check_backend(backend, "static")
    command = shlex.join(["tts", *sys.argv[1:]])
    if workload == "attention":
        typer.echo(run_attention_bench(max(repeats, 9), command))
        return
    if workload in ("all", "generate-score"):
        config = EngineBenchConfig(num_prompts=num_prompts, new_tokens=new_tokens, beams=beams, steps=steps,
                                   repeats=repeats, dtypes=parse_dtypes(dtypes), vllm=backend == "vllm")
        typer.echo(run_engine_bench(config, command))
    if workload in ("all", "beam"):
        typer.echo(run_beam_bench(BeamBenchConfig(new_tokens=beam_new_tokens, repeats=repeats, hf=beam_hf,
                                                  dtypes=parse_dtypes(dtypes)), command))


@command(bench_app, "gpu")
def bench_gpu_command(
    search_limit: Annotated[int, typer.Option(help="MATH-500 problems for the search part (0 skips it).")] = 50,
    repeats: Annotated[int, typer.Option(help="Alternating repetitions; medians reported.")] = 3,
) -> None:
    """Seed-model shapes on dummy weights vs HF and the roofline; needs CUDA (writes gpu.json/md)."""
    from evals.bench_gpu import GpuBenchConfig, run_gpu_bench

    config = GpuBenchConfig(search_limit=search_limit, repeats=repeats)
    typer.echo(run_gpu_bench(config, shlex.join(["tts", *sys.argv[1:]])))


@command(bench_app, "host")
def bench_host_command(
    limits: Annotated[str, typer.Option(help="Comma-separated MATH-500 problem counts.")] = "20,100",
    problem_batches: Annotated[str, typer.Option(help="Comma-separated problem batches.")] = "16,64",
    device: Annotated[str, typer.Option(help="sim or sim:COSTS.json.")] = "sim",
) -> None:
    """Host time of the main job on a simulated H100 (writes host.json/md); evals/bench_host.py."""
    from evals.bench_host import main as bench_host_main

    bench_host_main(["--limits", *limits.split(","), "--problem-batches", *problem_batches.split(","),
                     "--device", device])


@command(bench_app, "pipeline")
def bench_pipeline_command(
    num_prompts: Annotated[int, typer.Option(help="Generate workload: prompts.")] = 32,
    new_tokens: Annotated[int, typer.Option(help="Generate workload: new tokens per prompt.")] = 64,
    beams: Annotated[int, typer.Option(help="Score workload: beams.")] = 16,
    steps: Annotated[int, typer.Option(help="Score workload: steps per beam.")] = 8,
    search_problems: Annotated[int, typer.Option(help="Search workload: MATH-500 problems.")] = 2,
    rounds: Annotated[int, typer.Option(help="Alternating rounds of every variant; medians.")] = 3,
    workloads: Annotated[str, typer.Option(help="Comma-separated: generate, score, search.")] = "generate,score,search",
    switches: Annotated[bool, typer.Option(help="Also PP2 throttle with each SiPipe switch off (generate).")] = True,
    attention_backend: Annotated[str, typer.Option(help="Every variant's attention backend: auto, cpu, torch.")]
    = "auto",
    out_dir: Annotated[Path, typer.Option(help="Where pipeline.json/md and pipeline_trace.json go.")]
    = Path("docs/benchmarks"),
) -> None:
    """PP1 (1 and 2 threads) vs PP2 (sarathi, throttle, SiPipe switches off): tokens/s, stage busy/idle,
    microbatches in flight (writes pipeline.json/md and a Chrome trace)."""
    from evals.bench_pipeline import PipelineBenchConfig, bench_pipeline

    config = PipelineBenchConfig(num_prompts=num_prompts, new_tokens=new_tokens, beams=beams, steps=steps,
                                 search_problems=search_problems, rounds=rounds,
                                 workloads=tuple(parse_csv(workloads, "workloads", str)), switches=switches,
                                 attention_backend=attention_backend, out_dir=out_dir)
    report = bench_pipeline(config, command=shlex.join(["tts", *sys.argv[1:]]), log=console.print)
    typer.echo(report.markdown_path.read_text())


@command(bench_app, "speculation")
def bench_speculation_command(
    limit: Annotated[int, typer.Option(help="First N MATH-500 problems.")] = 20,
    n: Annotated[int, typer.Option()] = 4,
    beam_width: Annotated[int, typer.Option()] = 4,
    num_iterations: Annotated[int, typer.Option()] = 5,
    max_step_tokens: Annotated[int, typer.Option()] = 96,
    max_tokens: Annotated[int, typer.Option(help="Token cap of the last iteration's run to the end.")] = 256,
    problem_batch: Annotated[int, typer.Option(help="Searches in flight.")] = 8,
    temperature: Annotated[float, typer.Option()] = SEARCH.temperature,
    seed: Annotated[int, typer.Option()] = SEARCH.seed,
    speculative_max_tokens: Annotated[Optional[int], typer.Option(help="Cap of one speculative step.")] = None,
    rounds: Annotated[int, typer.Option(help="Alternating rounds (off, on); medians.")] = 2,
    dataset_path: Annotated[Optional[str], typer.Option()] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda ...")] = "auto",
    device_memory: Annotated[Optional[str], typer.Option(help="Memory budget for both models.")] = "3GiB",
) -> None:
    """Speculative beam extension off vs on, side by side on beam search: problems/min, goodput,
    speculative tokens kept and discarded (writes docs/benchmarks/speculation.json/md)."""
    from evals.bench_speculation import SpeculationBench, bench_speculation

    config = SearchConfig(method="beam", n=n, beam_width=beam_width, num_iterations=num_iterations,
                          max_step_tokens=max_step_tokens, max_tokens=max_tokens, problem_batch=problem_batch,
                          temperature=temperature, seed=seed, speculative_max_tokens=speculative_max_tokens)
    resolve_device(device)
    bench = SpeculationBench(config=config, limit=limit, rounds=rounds, dataset_path=dataset_path,
                             memory=memory_config(device_memory, 0.3, "static"), device=device)
    path = bench_speculation(bench, command=["tts", *sys.argv[1:]], log=console.print)
    typer.echo(path.read_text())
