"""`tts beam`, `tts bon`, `tts dvts`: a search on a dataset into a run folder (optionally scaled out with Ray)."""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from memory.split import MemoryConfig, parse_size
from search.config import SearchConfig
from search.progress import SearchProgress
from search.results import FailedProblem
from tts_runtime.cli.common import (ATTENTION_BACKENDS, COHOST, DEFAULT_GENERATOR, DEFAULT_PRM, DTYPE_HELP, SCHEDULER, SEARCH,
                                    THROTTLE, command, console, memory_config, parse_csv)
from tts_runtime.cohost.runtime import Runtime, check_backend, check_cohost
from tts_runtime.config import (CacheConfig, CohostConfig, ConfigError, EngineConfig, ModelSpec, ParallelConfig,
                                SchedulerConfig, ThrottleConfig, resolve_device, resolve_dtype)
from tts_runtime.engine.scheduler import budget_policy
from tts_runtime.models.registry import resolve
from tts_runtime.runs.datasets import DatasetConfig, load_problems
from tts_runtime.runs.run import run_config, run_into_folder
from tts_runtime.runs.run_folder import RunFolder
from tts_runtime.runs.scale_config import ScaleOut


def _make_search_command(app: typer.Typer, method: str, summary: str) -> None:
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
        n: Annotated[int, typer.Option(help="Beams (beam search), samples (best-of-N), leaves (DVTS).")] = SEARCH.n,
        beam_width: Annotated[int, typer.Option(help="M: beam search keeps n/M beams; DVTS grows n/M "
                                                "subtrees of M.")] = SEARCH.beam_width,
        num_iterations: Annotated[int, typer.Option(help="Most steps per beam.")] = SEARCH.num_iterations,
        max_step_tokens: Annotated[int, typer.Option(help="Token cap per step.")] = SEARCH.max_step_tokens,
        max_tokens: Annotated[int, typer.Option(help="Token cap per whole solution (best-of-N, "
                                                "--eos-sampling).")] = SEARCH.max_tokens,
        temperature: Annotated[float, typer.Option(help="0 is greedy.")] = SEARCH.temperature,
        top_p: Annotated[float, typer.Option()] = SEARCH.top_p,
        aggregation: Annotated[str, typer.Option(help="Step scores to beam score: last, min, prod, "
                                                 "mean.")] = SEARCH.aggregation,
        filter_duplicates: Annotated[bool, typer.Option(help="Drop beams with identical text.")] = SEARCH.filter_duplicates,
        sort_completed: Annotated[bool, typer.Option(help="Keep the best-scored completed beams (off: the "
                                                     "first n to complete).")] = SEARCH.sort_completed,
        eos_sampling: Annotated[bool, typer.Option(help="At the last iteration let beams run to the end "
                                                   "(--max-tokens) and count them completed.")] = SEARCH.eos_sampling,
        pad_completed: Annotated[bool, typer.Option(help="Pad fewer than n completed beams to n with "
                                                    "copies.")] = SEARCH.pad_completed,
        survivor_order: Annotated[str, typer.Option(help="Kept beams in generation order ('original') or "
                                                    "best first ('score').")] = SEARCH.survivor_order,
        vote_aggregation: Annotated[str, typer.Option(help="Step scores to a weighted-vote weight: last, "
                                                      "min, prod, mean.")] = SEARCH.vote_aggregation,
        vote_ties: Annotated[str, typer.Option(help="Equal votes: 'first' group seen or the 'best' "
                                               "single score.")] = SEARCH.vote_ties,
        problem_batch: Annotated[int, typer.Option(help="Searches in flight at once.")] = SEARCH.problem_batch,
        seed: Annotated[int, typer.Option()] = SEARCH.seed,
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
                                                      "(gLLM token throttling).")] = SCHEDULER.policy,
        throttle_iterations: Annotated[int, typer.Option(help="throttle #T: spread waiting prefill over "
                                                         "this many microbatches.")] = THROTTLE.iterations,
        throttle_max_prefill: Annotated[int, typer.Option(help="throttle #MaxP.")] = THROTTLE.max_prefill,
        throttle_min_prefill: Annotated[int, typer.Option(help="throttle #MinP.")] = THROTTLE.min_prefill,
        throttle_kv_threshold: Annotated[float, typer.Option(help="throttle: no prefill while the free "
                                                             "KV fraction is below this.")] = THROTTLE.kv_threshold,
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
                                                       "generator and PRM phases).")] = COHOST.phase_policy,
        prm_buffer_tokens: Annotated[int, typer.Option(help="batched: switch to the PRM once this many "
                                                            "uncached tokens wait for it.")] = COHOST.prm_buffer_tokens,
        generator_low_water: Annotated[int, typer.Option(help="batched: switch to the PRM once the generator "
                                                              "has this few unfinished sequences.")]
        = COHOST.generator_low_water,
        generator_buffer_seqs: Annotated[int, typer.Option(help="batched: back to the generator once this "
                                                                "many sequences wait for it.")]
        = COHOST.generator_buffer_seqs,
        overlap: Annotated[bool, typer.Option(help="Run the generator's and the PRM's forwards at the same "
                                                   "time (a worker process each on CPU, a CUDA stream each "
                                                   "on GPU).")] = COHOST.overlap,
        speculative_extension: Annotated[bool, typer.Option(help="Beam search: a beam whose step finished "
                                                                 "starts its next step while the others "
                                                                 "finish (FastTTS); same decisions.")]
        = SEARCH.speculative_extension,
        speculative_max_tokens: Annotated[Optional[int], typer.Option(help="Cap of one speculative step "
                                                                           "(default: the step cap).")]
        = SEARCH.speculative_max_tokens,
        host_kv_memory: Annotated[str, typer.Option(help="Host KV tier per model, e.g. 2GiB: evicted prefix "
                                                         "blocks wait there and are swapped back in instead "
                                                         "of recomputed (0: off).")] = "0",
        host_kv_prefetch: Annotated[bool, typer.Option(help="Host KV tier: swap in the blocks of requests "
                                                            "about to be admitted one step ahead.")] = True,
        prefix_aware_order: Annotated[bool, typer.Option(help="Admit waiting requests that share a prefix "
                                                              "together (FastTTS).")] = SCHEDULER.prefix_aware_order,
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
                     "levels": sorted(parse_csv(levels, "levels", int) or []) or None,
                     "ids": sorted(parse_csv(ids, "ids", str) or []) or None}
        scale = _scale_out(replicas, ray_address, threads_per_replica, device)
        scheduler = SchedulerConfig(policy=scheduler_policy, throttle=ThrottleConfig(
            throttle_iterations, throttle_max_prefill, throttle_min_prefill, throttle_kv_threshold),
            prefix_aware_order=prefix_aware_order)
        budget_policy(scheduler_policy)  # an unknown name fails now, not after loading the models
        parallel = ParallelConfig(pp, tuple(parse_csv(pp_layers, "pp-layers", int) or []) or None, pp_transport,
                                  threads_per_stage=threads_per_stage, sample_on_driver=sample_on_driver,
                                  token_safe=token_safe, structure_aware=structure_aware)
        if attention_backend not in ATTENTION_BACKENDS:
            raise ConfigError(f"unknown attention backend '{attention_backend}'; choose "
                              f"{', '.join(ATTENTION_BACKENDS)}")
        _run_search_command(config, selection, ModelSpec(generator, dtype), ModelSpec(prm, dtype), out, resume,
                            device,
                            memory_config(device_memory, memory_split, memory_policy), scale, scheduler, parallel,
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
    problems = load_problems(DatasetConfig(
        dataset=selection["name"], dataset_path=selection["path"], limit=selection["limit"],
        levels=tuple(selection["levels"]) if selection["levels"] else None,
        ids=tuple(selection["ids"]) if selection["ids"] else None))
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
        from tts_runtime.runs.scaleout import ReplicaSpec  # imports Ray: only for runs that use it

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
    from tts_runtime.runs.scaleout import run_scaled

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


def register(app: typer.Typer) -> None:
    _make_search_command(app, "beam", "PRM-guided beam search on a dataset.")
    _make_search_command(app, "bon", "Best-of-N: N whole samples, PRM-scored, then naive/weighted/majority picks.")
    _make_search_command(app, "dvts", "Diverse verifier tree search: n/M independent subtrees of width M.")
