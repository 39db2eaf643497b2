"""The `tts` command line: searches on datasets, model listing and benchmarks.

Every command is registered with `command(parent, name)`, which prints a user mistake
(any ConfigError) as one line `error: ...` with exit code 2 instead of a traceback.
Adding a command is one decorated function; adding a group is one `add_typer` line.
"""

from __future__ import annotations

import functools
import shlex
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from evals.bench_search import SearchBench, bench_search
from evals.datasets import load_problems
from evals.report import RunFolder
from evals.scale_config import ScaleOut
from evals.run import run_config, run_into_folder
from memory.report import profile_command
from memory.split import MemoryConfig, parse_size
from memory.sweep import sweep_memory
from search.config import SearchConfig
from search.progress import SearchProgress
from search.results import FailedProblem
from tts_runtime.config import (CacheConfig, CohostConfig, ConfigError, EngineConfig, ModelSpec, ParallelConfig,
                                SchedulerConfig, ThrottleConfig, resolve_device, resolve_dtype)
from tts_runtime.executor.pipeline import PipelineFailure
from tts_runtime.engine.scheduler import budget_policy
from tts_runtime.models.registry import ALIASES, BUILTIN_CONFIGS, resolve
from tts_runtime.runtime import Runtime, check_backend, check_cohost

DEFAULT_GENERATOR = "smollm2-135m-instruct"
DEFAULT_PRM = "gemma3-270m"
ATTENTION_BACKENDS = ("auto", "cpu", "torch", "triton")
DTYPE_HELP = ("Both models' weights and activations: auto (bf16 on a GPU and on a CPU with AVX512-BF16, "
              "else fp32), float32 (the parity reference), bfloat16 or float16.")

app = typer.Typer(name="tts", help="Test-time-compute search: PRM-guided beam search, best-of-N, DVTS.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_show_locals=False)
models_app = typer.Typer(help="Models the runtime can load.", no_args_is_help=True)
bench_app = typer.Typer(help="Benchmarks (JSON + markdown under docs/benchmarks/).", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(bench_app, name="bench")

console = Console(stderr=True)


def command(parent: typer.Typer, name: str, **options: Any) -> Callable[[Callable], Callable]:
    """Register `fn` as `parent`'s command `name`, with one-line errors for user mistakes."""
    def register(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except ConfigError as exc:
                typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
                raise typer.Exit(2) from None
            except PipelineFailure as exc:  # the first line names the stage; a traceback may follow
                typer.echo(f"error: {str(exc).splitlines()[0]}", err=True)
                raise typer.Exit(1) from None
        parent.command(name, **options)(run)
        return fn
    return register


# -- search commands -----------------------------------------------------------------

_D = SearchConfig()
_S = SchedulerConfig()
_T = ThrottleConfig()
_C = CohostConfig()


def _csv(text: str | None, what: str, cast: Callable[[str], Any]) -> set | None:
    if text is None:
        return None
    try:
        return {cast(item.strip()) for item in text.split(",") if item.strip()}
    except ValueError:
        raise ConfigError(f"--{what} takes a comma-separated list, e.g. 1,2,3; got '{text}'") from None


def _memory_config(device_memory: str | None, memory_split: float, memory_policy: str) -> MemoryConfig:
    size = parse_size(device_memory) if device_memory else None
    return MemoryConfig(device_memory=size, prm_fraction=memory_split, policy=memory_policy)


def _make_search_command(method: str, summary: str) -> None:
    def search_command(
        dataset: Annotated[str, typer.Option(help="'math500' or a JSONL file with problem/answer fields.")] = "math500",
        limit: Annotated[Optional[int], typer.Option(help="Only the first N problems.")] = None,
        levels: Annotated[Optional[str], typer.Option(help="Only these levels, e.g. 1,2.")] = None,
        ids: Annotated[Optional[str], typer.Option(help="Only these problem ids, comma-separated.")] = None,
        dataset_path: Annotated[Optional[str], typer.Option(help="Local MATH-500 copy (file or folder).")] = None,
        generator: Annotated[str, typer.Option(help="Generator: alias, HF folder or .gguf.")] = DEFAULT_GENERATOR,
        prm: Annotated[str, typer.Option(help="PRM: alias, HF folder or .gguf.")] = DEFAULT_PRM,
        prm_format: Annotated[Optional[str], typer.Option(help="rlhflow, math-shepherd, qwen-prm or judge "
                                                          "(default: from the PRM's name).")] = None,
        n: Annotated[int, typer.Option(help="Beams (beam search), samples (best-of-N), leaves (DVTS).")] = _D.n,
        beam_width: Annotated[int, typer.Option(help="M: beam search keeps n/M beams; DVTS grows n/M "
                                                "subtrees of M.")] = _D.beam_width,
        num_iterations: Annotated[int, typer.Option(help="Most steps per beam.")] = _D.num_iterations,
        max_step_tokens: Annotated[int, typer.Option(help="Token cap per step.")] = _D.max_step_tokens,
        max_tokens: Annotated[int, typer.Option(help="Token cap per whole solution (best-of-N, "
                                                "--eos-sampling).")] = _D.max_tokens,
        temperature: Annotated[float, typer.Option(help="0 is greedy.")] = _D.temperature,
        top_p: Annotated[float, typer.Option()] = _D.top_p,
        aggregation: Annotated[str, typer.Option(help="Step scores to beam score: last, min, prod, "
                                                 "mean.")] = _D.aggregation,
        filter_duplicates: Annotated[bool, typer.Option(help="Drop beams with identical text.")] = _D.filter_duplicates,
        sort_completed: Annotated[bool, typer.Option(help="Keep the best-scored completed beams (off: the "
                                                     "first n to complete).")] = _D.sort_completed,
        eos_sampling: Annotated[bool, typer.Option(help="At the last iteration let beams run to the end "
                                                   "(--max-tokens) and count them completed.")] = _D.eos_sampling,
        pad_completed: Annotated[bool, typer.Option(help="Pad fewer than n completed beams to n with "
                                                    "copies.")] = _D.pad_completed,
        survivor_order: Annotated[str, typer.Option(help="Kept beams in generation order ('original') or "
                                                    "best first ('score').")] = _D.survivor_order,
        vote_aggregation: Annotated[str, typer.Option(help="Step scores to a weighted-vote weight: last, "
                                                      "min, prod, mean.")] = _D.vote_aggregation,
        vote_ties: Annotated[str, typer.Option(help="Equal votes: 'first' group seen or the 'best' "
                                               "single score.")] = _D.vote_ties,
        problem_batch: Annotated[int, typer.Option(help="Searches in flight at once.")] = _D.problem_batch,
        seed: Annotated[int, typer.Option()] = _D.seed,
        out: Annotated[Optional[Path], typer.Option(help="Run folder (default runs/<method>-<time>).")] = None,
        resume: Annotated[bool, typer.Option(help="Continue the run in --out, skipping finished "
                                             "problems.")] = False,
        device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:1 ...")] = "auto",
        dtype: Annotated[str, typer.Option(help=DTYPE_HELP)] = "auto",
        device_memory: Annotated[Optional[str], typer.Option(help="Memory budget for both models, e.g. "
                                                             "6GiB (default: the GPU's, 8GiB on CPU).")] = None,
        memory_split: Annotated[float, typer.Option(help="Share of the KV budget for the PRM.")] = 0.3,
        memory_policy: Annotated[str, typer.Option(help="static, auto or elastic.")] = "static",
        backend: Annotated[str, typer.Option(help="native (our engine) or vllm (both models on vLLM "
                                             "engines; needs the vllm extra).")] = "native",
        replicas: Annotated[Optional[int], typer.Option(help="Run N runtime replicas as Ray actors (one per "
                                                        "GPU; on CPU --threads-per-replica each).")] = None,
        ray_address: Annotated[Optional[str], typer.Option(help="Join this Ray cluster (default: a local one "
                                                           "started for the run).")] = None,
        threads_per_replica: Annotated[int, typer.Option(help="Torch threads (and Ray CPUs) per "
                                                         "replica.")] = 1,
        scheduler_policy: Annotated[str, typer.Option(help="sarathi (fill the token budget) or throttle "
                                                      "(gLLM token throttling).")] = _S.policy,
        throttle_iterations: Annotated[int, typer.Option(help="throttle #T: spread waiting prefill over "
                                                         "this many microbatches.")] = _T.iterations,
        throttle_max_prefill: Annotated[int, typer.Option(help="throttle #MaxP.")] = _T.max_prefill,
        throttle_min_prefill: Annotated[int, typer.Option(help="throttle #MinP.")] = _T.min_prefill,
        throttle_kv_threshold: Annotated[float, typer.Option(help="throttle: no prefill while the free "
                                                             "KV fraction is below this.")] = _T.kv_threshold,
        pp: Annotated[int, typer.Option(help="Pipeline stages (processes), each running a slice of "
                                             "both models' layers.")] = 1,
        pp_layers: Annotated[Optional[str], typer.Option(help="Generator layers per stage, e.g. 16,14 "
                                                              "(default: balanced on measured time).")] = None,
        threads_per_stage: Annotated[Optional[int], typer.Option(help="Torch threads per stage "
                                                                      "(default: cores / pp).")] = None,
        pp_transport: Annotated[str, typer.Option(help="Activations between stages: shm (shared memory), "
                                                       "gloo or nccl (torch.distributed); auto: nccl when every "
                                                       "stage has a GPU of its own, else shm.")] = "auto",
        sample_on_driver: Annotated[bool, typer.Option(help="SiPipe: sample on the driver while the "
                                                            "stages run on.")] = True,
        token_safe: Annotated[bool, typer.Option(help="SiPipe: prepare the next microbatch's inputs "
                                                      "while one computes.")] = True,
        structure_aware: Annotated[bool, typer.Option(help="SiPipe: activations through pre-sized "
                                                           "shared-memory slots, no shape messages.")] = True,
        attention_backend: Annotated[str, typer.Option(help="auto (the C++ kernel on CPU, triton on CUDA), "
                                                            "cpu, torch or triton.")] = "auto",
        cascade: Annotated[Optional[bool], typer.Option(help="Shared-prefix (cascade) attention (default: on "
                                                             "in the cpu backend, off in triton).")] = None,
        attention_bf16_dot: Annotated[bool, typer.Option(help="cpu backend, bf16 models: dot products on "
                                                              "AVX512-BF16 where the CPU has it, and a "
                                                              "coarser softmax exp.")] = True,
        linear_backend: Annotated[str, typer.Option(help="CPU projections and output layer: auto "
                                                         "(onednn where torch has it), onednn, prepacked (oneDNN "
                                                         "on weights reordered once: faster decode, a packed "
                                                         "copy in the memory budget), streamed (bf16 models: "
                                                         "tts's AVX512-BF16 kernel on weights packed once into "
                                                         "one sequential stream, the fastest without AMX; on "
                                                         "AMX CPUs only for calls of 1-2 rows; same memory as "
                                                         "prepacked), or torch (F.linear).")] = "auto",
        cpu_fused_ops: Annotated[bool, typer.Option(help="CPU: RMSNorm, rotary embedding and the gated "
                                                         "activation as one C++ pass each (off: torch's eager "
                                                         "ops, bit-exact with HF).")] = True,
        phase_policy: Annotated[str, typer.Option(help="auto (batched on a GPU, alternate on CPU), alternate "
                                                       "(each engine every step) or batched (Seesaw: long "
                                                       "generator and PRM phases).")] = _C.phase_policy,
        prm_buffer_tokens: Annotated[int, typer.Option(help="batched: switch to the PRM once this many "
                                                            "uncached tokens wait for it.")] = _C.prm_buffer_tokens,
        generator_low_water: Annotated[int, typer.Option(help="batched: switch to the PRM once the generator "
                                                              "has this few unfinished sequences.")]
        = _C.generator_low_water,
        generator_buffer_seqs: Annotated[int, typer.Option(help="batched: back to the generator once this "
                                                                "many sequences wait for it.")]
        = _C.generator_buffer_seqs,
        overlap: Annotated[bool, typer.Option(help="Run the generator's and the PRM's forwards at the same "
                                                   "time (a worker process each on CPU, a CUDA stream each "
                                                   "on GPU).")] = _C.overlap,
        speculative_extension: Annotated[bool, typer.Option(help="Beam search: a beam whose step finished "
                                                                 "starts its next step while the others "
                                                                 "finish (FastTTS); same decisions.")]
        = _D.speculative_extension,
        speculative_max_tokens: Annotated[Optional[int], typer.Option(help="Cap of one speculative step "
                                                                           "(default: the step cap).")]
        = _D.speculative_max_tokens,
        host_kv_memory: Annotated[str, typer.Option(help="Host KV tier per model, e.g. 2GiB: evicted prefix "
                                                         "blocks wait there and are swapped back in instead "
                                                         "of recomputed (0: off).")] = "0",
        host_kv_prefetch: Annotated[bool, typer.Option(help="Host KV tier: swap in the blocks of requests "
                                                            "about to be admitted one step ahead.")] = True,
        prefix_aware_order: Annotated[bool, typer.Option(help="Admit waiting requests that share a prefix "
                                                              "together (FastTTS).")] = _S.prefix_aware_order,
    ) -> None:
        config = SearchConfig(
            method=method, n=n, beam_width=beam_width, num_iterations=num_iterations,
            temperature=temperature, top_p=top_p, max_step_tokens=max_step_tokens, max_tokens=max_tokens,
            aggregation=aggregation, filter_duplicates=filter_duplicates, sort_completed=sort_completed,
            eos_sampling=eos_sampling, pad_completed=pad_completed, survivor_order=survivor_order,
            vote_aggregation=vote_aggregation, vote_ties=vote_ties, prm_format=prm_format,
            problem_batch=problem_batch, seed=seed, speculative_extension=speculative_extension,
            speculative_max_tokens=speculative_max_tokens)
        selection = {"name": dataset, "path": dataset_path, "limit": limit,
                     "levels": sorted(_csv(levels, "levels", int) or []) or None,
                     "ids": sorted(_csv(ids, "ids", str) or []) or None}
        scale = _scale_out(replicas, ray_address, threads_per_replica, device)
        scheduler = SchedulerConfig(policy=scheduler_policy, throttle=ThrottleConfig(
            throttle_iterations, throttle_max_prefill, throttle_min_prefill, throttle_kv_threshold),
            prefix_aware_order=prefix_aware_order)
        budget_policy(scheduler_policy)  # an unknown name fails now, not after loading the models
        parallel = ParallelConfig(pp, tuple(_csv(pp_layers, "pp-layers", int) or []) or None, pp_transport,
                                  threads_per_stage=threads_per_stage, sample_on_driver=sample_on_driver,
                                  token_safe=token_safe, structure_aware=structure_aware)
        if attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"unknown attention backend '{attention_backend}'; choose "
                              f"{', '.join(ATTENTION_BACKENDS)}")
        _run_search_command(config, selection, ModelSpec(generator, dtype), ModelSpec(prm, dtype), out, resume,
                            device,
                            _memory_config(device_memory, memory_split, memory_policy), scale, scheduler, parallel,
                            backend=backend, attention=(attention_backend, cascade, attention_bf16_dot),
                            linear_backend=linear_backend, cpu_fused_ops=cpu_fused_ops,
                            cohost=CohostConfig(phase_policy, prm_buffer_tokens, generator_low_water,
                                                generator_buffer_seqs, overlap),
                            cache=CacheConfig(host_kv_bytes=parse_size(host_kv_memory),
                                              host_kv_prefetch=host_kv_prefetch))

    search_command.__doc__ = summary
    command(app, method)(search_command)


def check_host_tier(cache: CacheConfig, backend: str, cohost: CohostConfig) -> None:
    """The host KV tier copies blocks of KV held in this process: one-line errors where it is not."""
    if not cache.host_kv_bytes:
        return
    if backend != "native":
        raise ConfigError("--host-kv-memory is a native-engine feature; drop it with --backend vllm")
    if cohost.overlap:
        raise ConfigError("--host-kv-memory needs the KV cache in this process; --overlap moves each model's "
                          "forward (and KV) to a worker: drop one of the two")


def _scale_out(replicas: int | None, ray_address: str | None, threads: int, device: str) -> ScaleOut | None:
    """None: search in this process; else how to spread the run over Ray."""
    if replicas is None and ray_address is None:
        return None
    gpus = 1 if resolve_device(device).type == "cuda" else 0
    return ScaleOut(replicas=1 if replicas is None else replicas, address=ray_address,
                    threads_per_replica=threads, gpus_per_replica=gpus)


def _run_search_command(config: SearchConfig, selection: dict, generator: ModelSpec, prm: ModelSpec,
                        out: Path | None,
                        resume: bool, device: str, memory: MemoryConfig, scale: ScaleOut | None = None,
                        scheduler: SchedulerConfig = SchedulerConfig(),
                        parallel: ParallelConfig = ParallelConfig(), *, backend: str = "native",
                        attention: tuple[str, bool | None, bool] = ("auto", None, True),
                        linear_backend: str = "auto", cpu_fused_ops: bool = True,
                        cohost: CohostConfig = CohostConfig(), cache: CacheConfig = CacheConfig()) -> None:
    problems = load_problems(selection["name"], dataset_path=selection["path"], limit=selection["limit"],
                             levels=set(selection["levels"]) if selection["levels"] else None,
                             ids=set(selection["ids"]) if selection["ids"] else None)
    if not problems:
        raise ConfigError("no problem matches the dataset filters (--limit, --levels, --ids)")
    if resume and out is None:
        raise ConfigError("--resume needs --out: the run folder to continue")
    # Catch unknown models and devices now, before minutes of loading.
    for spec in (generator, prm):
        resolve(spec.model)
        resolve_dtype(spec.dtype, resolve_device(device))
    check_backend(backend, memory.policy)
    check_cohost(backend, memory.policy, cohost)
    check_host_tier(cache, backend, cohost)
    if backend != "native" and scale is not None:
        raise ConfigError("--backend vllm runs in this process; Ray replicas (--replicas, --ray-address) "
                          "serve the native engine")
    engine_config = EngineConfig(cache=cache, device=device, scheduler=scheduler, parallel=parallel,
                                 attention_backend=attention[0], cascade_attention=attention[1],
                                 attention_bf16_dot=attention[2],
                                 linear_backend=linear_backend, cpu_fused_ops=cpu_fused_ops, cohost=cohost)
    folder = RunFolder.open(out or Path("runs") / f"{config.method}-{time.strftime('%Y%m%d-%H%M%S')}",
                            resume=resume)
    if scale is not None:
        from evals.scaleout import ReplicaSpec  # imports Ray: only for runs that use it

        _run_scaled_command(config, selection, problems, ReplicaSpec(generator, prm, memory, engine_config),
                            folder, scale)
        return
    console.print(f"loading {generator.model} + {prm.model} ...")
    runtime = Runtime(generator, prm, memory=memory, engine_config=engine_config,
                      backend=backend)
    try:
        folder.write_config(run_config(runtime, config, selection, sys.argv))
        finished = {result.id for result in folder.finished_results()}
        live = SearchProgress()
        with _SearchProgress(lambda: runtime.generator.stats.generated_tokens,
                             sum(problem.id not in finished for problem in problems), live.iteration) as progress:
            outcome = run_into_folder(runtime, problems, config, folder, on_result=progress.advance,
                                      progress=live)
    except KeyboardInterrupt:
        console.print(f"interrupted: finished problems are in {folder.path}; continue with --resume "
                      f"--out {shlex.quote(str(folder.path))}")
        raise typer.Exit(130) from None
    finally:
        runtime.shutdown()
    _print_failures(outcome.failed)
    _print_summary(outcome.metrics, folder.path)


def _run_scaled_command(config: SearchConfig, selection: dict, problems: list, spec: ReplicaSpec,
                        folder: RunFolder, scale: ScaleOut) -> None:
    """The run on Ray replicas; one progress bar, started once the replicas are up."""
    from evals.scaleout import run_scaled

    generated = [0]
    with ExitStack() as stack:
        bars: list[_SearchProgress] = []

        def started(pool, todo: int) -> None:
            hosts = sorted({replica.info.host for replica in pool.replicas})
            console.print(f"{len(pool.replicas)} replica(s) of {spec.generator.model} + {spec.prm.model} up on "
                          f"{', '.join(hosts)}")
            bars.append(stack.enter_context(_SearchProgress(lambda: generated[0], todo)))

        def landed(result) -> None:
            generated[0] += result.generated_tokens
            bars[0].advance(result)

        try:
            outcome = run_scaled(spec, problems, config, folder, scale, dataset=selection, command=sys.argv,
                                 on_start=started, on_result=landed)
        except KeyboardInterrupt:
            console.print(f"interrupted: finished problems are in {folder.path}; continue with --resume "
                          f"--out {shlex.quote(str(folder.path))}")
            raise typer.Exit(130) from None
    scaleout = outcome.metrics["scaleout"]
    _print_failures(outcome.failed)
    if scaleout["retries"] or scaleout["replica_restarts"]:
        console.print(f"{scaleout['retries']} problem(s) re-queued; {scaleout['replica_restarts']} replica(s) "
                      f"restarted, {scaleout['replicas_lost']} lost")
    _print_summary(outcome.metrics, folder.path)


class _Rate(ProgressColumn):
    """A rate read live from a counter (refreshed by rich's thread while the search runs)."""

    def __init__(self, read: Callable[[], float], unit: str) -> None:
        super().__init__()
        self.read, self.unit, self.start = read, unit, time.perf_counter()
        self.base = read()

    def render(self, task) -> Text:
        elapsed = time.perf_counter() - self.start
        value = (self.read() - self.base) / elapsed if elapsed > 0 else 0.0
        return Text(f"{value:.2f} {self.unit}")


class _Now(ProgressColumn):
    """A value read live (e.g. the furthest search iteration in flight)."""

    def __init__(self, read: Callable[[], object], label: str) -> None:
        super().__init__()
        self.read, self.label = read, label

    def render(self, task) -> Text:
        return Text(f"{self.label} {self.read()}")


class _SearchProgress:
    """Problems this session still has to solve, accuracy so far, the furthest iteration in
    flight, live problems/s and tokens/s. Without a terminal (a pipe, a CI log) a live bar
    shows nothing, so each finished problem is printed as one line instead."""

    def __init__(self, generated_tokens: Callable[[], float], total: int,
                 iteration: Callable[[], object] = lambda: "-") -> None:
        self.correct = 0
        self.done = 0
        self.total = total
        self.bar = Progress(
            TextColumn("[bold]problems"), BarColumn(), MofNCompleteColumn(),
            TextColumn("acc {task.fields[accuracy]}"), _Now(iteration, "iteration"),
            _Rate(lambda: self.done, "problems/s"),
            _Rate(generated_tokens, "tok/s"),
            TimeElapsedColumn(), console=console, disable=not console.is_terminal)
        self.task = self.bar.add_task("search", total=total, accuracy="-")

    def advance(self, result) -> None:
        self.done += 1
        self.correct += bool(result.correct)
        self.bar.update(self.task, advance=1, accuracy=f"{self.correct / self.done:.1%}")
        if not console.is_terminal:
            # Answers hold brackets and backslashes: print them as text, not rich markup.
            console.print(_result_line(result, self.done, self.total), markup=False, highlight=False,
                          soft_wrap=True)

    def __enter__(self) -> _SearchProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


def _result_line(result, done: int, total: int) -> str:
    verdict = "correct" if result.correct else "wrong"
    return (f"[{done}/{total}] {result.id} (level {result.level}): {verdict}, answer {result.prediction} "
            f"(reference {result.reference}); {result.iterations} iterations, "
            f"{result.generated_tokens} tokens, {result.seconds:.1f} s")


def _print_failures(failed: list[FailedProblem]) -> None:
    for failure in failed:
        console.print(f"failed, its error is in results.jsonl (--resume retries it): {failure.id}: {failure.error}")


def _print_summary(metrics: dict, folder: Path) -> None:
    speed = metrics["throughput"]
    table = Table(title=f"{metrics['problems']} problems  ·  {folder}", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("accuracy (best beam)", f"{metrics['accuracy']:.1%}")
    table.add_row("accuracy (weighted vote)", f"{metrics['weighted_accuracy']:.1%}")
    table.add_row("accuracy (majority vote)", f"{metrics['majority_accuracy']:.1%}")
    for level, row in metrics["per_level"].items():
        table.add_row(f"  level {level}", f"{row['accuracy']:.1%} of {row['problems']}")
    table.add_row("problems/min", f"{speed['problems_per_min']:.2f}")
    table.add_row("generator tokens (per s)", f"{speed['generated_tokens']} ({speed['generator_tokens_per_s']:.1f})")
    table.add_row("PRM tokens (per s)", f"{speed['prm_tokens']} ({speed['prm_tokens_per_s']:.1f})")
    table.add_row("prefix hit rate generator / PRM",
                  f"{speed['prefix_hit_rate']['generator']:.1%} / {speed['prefix_hit_rate']['prm']:.1%}")
    table.add_row("score-cache hit rate", f"{speed['score_cache']['hit_rate']:.1%}")
    table.add_row("run folder", str(folder))
    Console().print(table)


_make_search_command("beam", "PRM-guided beam search on a dataset.")
_make_search_command("bon", "Best-of-N: N whole samples, PRM-scored, then naive/weighted/majority picks.")
_make_search_command("dvts", "Diverse verifier tree search: n/M independent subtrees of width M.")


# -- models --------------------------------------------------------------------------

@command(models_app, "list")
def models_list() -> None:
    """Every model alias and built-in dummy shape: architecture, size, where it resolves."""
    table = Table("name", "architecture", "size", "resolves to")
    for alias in ALIASES.values():
        try:
            where = str(alias.locate())
        except ConfigError as exc:
            where = f"not installed: {exc}"
        table.add_row(alias.name, alias.architecture, alias.parameters, f"{where} ({alias.source})")
    for shape, config in BUILTIN_CONFIGS.items():
        table.add_row(f"dummy:{shape}", config["model_type"], _parameters(config), "random weights (built-in shape)")
    Console().print(table)


def _parameters(config: dict) -> str:
    """Parameter count of a Llama-shaped config, e.g. '1.24B'."""
    hidden, layers, inter = config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]
    head_dim = config.get("head_dim", hidden // config["num_attention_heads"])
    attention = hidden * head_dim * (2 * config["num_attention_heads"] + 2 * config["num_key_value_heads"])
    embeddings = config["vocab_size"] * hidden * (1 if config.get("tie_word_embeddings") else 2)
    total = embeddings + layers * (attention + 3 * hidden * inter)
    return f"{total / 1e9:.2f}B" if total >= 1e9 else f"{total / 1e6:.0f}M"


# -- benchmarks ----------------------------------------------------------------------

@command(bench_app, "search")
def bench_search_command(
    limit: Annotated[int, typer.Option(help="First N MATH-500 problems.")] = 20,
    n: Annotated[int, typer.Option()] = 4,
    beam_width: Annotated[int, typer.Option()] = 4,
    num_iterations: Annotated[int, typer.Option()] = _D.num_iterations,
    max_step_tokens: Annotated[int, typer.Option()] = _D.max_step_tokens,
    max_tokens: Annotated[int, typer.Option(help="Token cap of the last iteration's run to the end.")] = _D.max_tokens,
    problem_batch: Annotated[int, typer.Option(help="tts searches in flight, and 1 beside it (the baseline "
                                                    "does one).")] = _D.problem_batch,
    seed: Annotated[int, typer.Option()] = _D.seed,
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
    parallel = ParallelConfig(pp, tuple(_csv(pp_layers, "pp-layers", int) or []) or None)
    config = SearchConfig(method="beam", n=n, beam_width=beam_width, num_iterations=num_iterations,
                          max_step_tokens=max_step_tokens, max_tokens=max_tokens, problem_batch=problem_batch,
                          seed=seed, prm_format=prm_format)
    bench = SearchBench(config=config, limit=limit, generator=generator, prm=prm, dataset_path=dataset_path,
                        memory=_memory_config(device_memory, 0.3, "static"), rounds=rounds, baseline=baseline,
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
    from evals.scaleout import ReplicaSpec

    config = SearchConfig(method="beam", n=n, beam_width=beam_width, num_iterations=num_iterations,
                          max_step_tokens=max_step_tokens, max_tokens=max_tokens, problem_batch=problem_batch)
    spec = ReplicaSpec(ModelSpec(DEFAULT_GENERATOR), ModelSpec(DEFAULT_PRM), _memory_config(device_memory, 0.3, "static"),
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
    max_tokens: Annotated[int, typer.Option(help="Token cap of a whole solution.")] = _D.max_tokens,
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
    bench = TieredKVBench(config, _memory_config(device_memory, memory_split, "static"), parse_size(host_kv_memory),
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
    seed: Annotated[int, typer.Option()] = _D.seed,
    rounds: Annotated[int, typer.Option(help="Alternating rounds of every variant; medians.")] = 2,
    variants: Annotated[str, typer.Option(help="Comma-separated, alternate first: alternate, batched, "
                                               "overlap, batched + overlap, speculation, prefix order, batched + prefix "
                                               "order, all.")]
    = "alternate,batched,overlap,batched + overlap,speculation,prefix order,batched + prefix order,all",
    prm_buffer_tokens: Annotated[int, typer.Option(help="Batched variants' PRM buffer.")] = _C.prm_buffer_tokens,
    generator_low_water: Annotated[int, typer.Option()] = _C.generator_low_water,
    generator_buffer_seqs: Annotated[int, typer.Option()] = _C.generator_buffer_seqs,
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
                        memory=_memory_config(device_memory, 0.3, "static"), device=device, dtype=dtype,
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
                                 workloads=tuple(_csv(workloads, "workloads", str)), switches=switches,
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
    temperature: Annotated[float, typer.Option()] = _D.temperature,
    seed: Annotated[int, typer.Option()] = _D.seed,
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
                             memory=_memory_config(device_memory, 0.3, "static"), device=device)
    path = bench_speculation(bench, command=["tts", *sys.argv[1:]], log=console.print)
    typer.echo(path.read_text())


command(app, "sweep-memory")(sweep_memory)
command(models_app, "profile")(profile_command)


if __name__ == "__main__":
    app()
