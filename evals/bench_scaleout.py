"""`tts bench scaleout`: one beam-search run on Ray replicas, side by side: 1 replica of 1
thread, 2 replicas of 1 thread each, 1 replica of 2 threads; same problems, same seeds,
one local cluster, rounds alternating (A, B, C, A, B, C ...), medians reported.

Problems/min counts from the moment every replica is up to the last result (model
loading is reported apart as startup seconds): it is what a long run converges to.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evals.bench import SideBySide, write_report
from search.config import SearchConfig
from tts_runtime.runs.datasets import DatasetConfig, load_problems
from tts_runtime.runs.run_folder import RunFolder
from tts_runtime.runs.scale_config import ScaleOut
from tts_runtime.options import option

if TYPE_CHECKING:  # the module itself imports Ray only when it runs: the CLI reads its options
    from tts_runtime.runs.scaleout import ReplicaSpec

VARIANTS: dict[str, tuple[int, int]] = {  # label: (replicas, threads per replica)
    "1 replica x 1 thread": (1, 1),
    "2 replicas x 1 thread": (2, 1),
    "1 replica x 2 threads": (1, 2),
}


# How the design carries to a cluster of GPU nodes, and what this CPU benchmark cannot show.
CLUSTER_NOTES = [
    "Placement: with --device cuda every replica asks Ray for one GPU (num_gpus=1), so N replicas land "
    "on N GPUs, spread over the nodes (SPREAD strategy); Ray sets CUDA_VISIBLE_DEVICES, so each replica "
    "co-hosts its generator and PRM on its own GPU with the one-process memory split. Start the cluster "
    "with `ray start --head` / `ray start --address HEAD:6379` and run `tts beam --ray-address HEAD:6379 "
    "--replicas N --device cuda` on a node with a GPU (the driver checks the device it is given).",
    "Data locality: replicas load the models by name from their own node's cache (~/.cache/tts, or a "
    "folder path valid on every node), so weights never cross the network; stage them on every node "
    "first. The driver ships problems (about 1 KB) and gets results back (about 10 KB); results.jsonl "
    "and --resume live on the driver's disk; only the driver needs the dataset.",
    "Scaling: replicas share nothing, so problems/min should grow with the number of GPUs until the "
    "queue runs dry; at the end of a run the last problems leave replicas idle (a long run amortises "
    "this, a short one does not). Each replica keeps --problem-batch searches in flight.",
    "Not tested here: GPUs, more than one machine, --ray-address to a cluster on other hosts (the tests "
    "join a local one), a lost node (Ray restarts the actor where resources allow), and speed at more "
    "than two replicas. The replica-death, resume and queue logic is tested on a local 2-CPU cluster "
    "(tests/runs/test_scaleout.py).",
]


@dataclass(frozen=True)
class ScaleoutBench:
    spec: ReplicaSpec
    config: SearchConfig
    limit: int = 8
    rounds: int = option(2, "Alternating rounds of the three variants; medians.", at_least=1)
    dataset_path: str | None = None


def _measure(bench: ScaleoutBench, problems: Sequence, replicas: int, threads: int) -> dict[str, Any]:
    from tts_runtime.runs.scaleout import run_scaled

    with tempfile.TemporaryDirectory() as tmp:
        outcome = run_scaled(bench.spec, problems, bench.config, RunFolder.open(Path(tmp) / "run", resume=False),
                             ScaleOut(replicas=replicas, threads_per_replica=threads))
    speed, scale = outcome.metrics["throughput"], outcome.metrics["scaleout"]
    return {"problems_per_min": speed["problems_per_min"], "seconds": speed["seconds"],
            "generator_tokens_per_s": speed["generator_tokens_per_s"], "startup_seconds": scale["startup_seconds"],
            "accuracy": outcome.metrics["accuracy"], "retries": scale["retries"],
            "replica_restarts": scale["replica_restarts"], "failed": len(scale["failed"]),
            "predictions": {r.id: r.prediction for r in outcome.new}}


def bench_scaleout(bench: ScaleoutBench, *, command: Sequence[str], log: Callable[[str], None]) -> Path:
    problems = load_problems(DatasetConfig(dataset_path=bench.dataset_path, limit=bench.limit))
    side = SideBySide("scaleout")

    def variant(label: str, replicas: int, threads: int) -> Callable[[], dict]:
        def run() -> dict:
            row = _measure(bench, problems, replicas, threads)
            log(f"  {label}: {row['problems_per_min']:.2f} problems/min ({row['seconds']:.0f} s, "
                f"startup {row['startup_seconds']:.0f} s)")
            return row
        return run

    # One local cluster with 2 CPUs serves every variant: 2 x 1 and 1 x 2 threads both fill it.
    from tts_runtime.runs.ray_pool import ray_cluster

    with ray_cluster(ScaleOut(replicas=2)):
        side.run({label: variant(label, *shape) for label, shape in VARIANTS.items()}, bench.rounds)
    base = next(iter(VARIANTS))
    rows = []
    for label, (replicas, threads) in VARIANTS.items():
        runs = side.runs[label]
        same = [sum(run["predictions"][pid] == reference["predictions"][pid] for pid in reference["predictions"])
                for run, reference in zip(runs, side.runs[base])]
        rows.append({
            "variant": label, "replicas": replicas, "threads_per_replica": threads,
            "problems_per_min": side.median(label, "problems_per_min"),
            "speedup": side.median(label, "problems_per_min") / side.median(base, "problems_per_min"),
            "generator_tokens_per_s": side.median(label, "generator_tokens_per_s"),
            "run_seconds": side.median(label, "seconds"), "startup_seconds": side.median(label, "startup_seconds"),
            "accuracy": side.median(label, "accuracy"),
            "same_prediction_as_1x1": f"{min(same)}/{len(problems)}",
            # A replica killed (e.g. by the kernel's out-of-memory killer) costs a reload: say so.
            "retries_restarts_failed": "/".join(str(sum(run[key] for run in runs))
                                                for key in ("retries", "replica_restarts", "failed")),
            "problems_per_min_each_round": [round(run["problems_per_min"], 3) for run in runs],
        })
    summary = {"problems": len(problems), "rounds": bench.rounds, "search": bench.config.to_dict(),
               **{f"speedup {row['variant']}": row["speedup"] for row in rows[1:]}}
    notes = [f"{len(problems)} MATH-500 problems, beam search n={bench.config.n} M={bench.config.beam_width}, "
             f"{bench.config.num_iterations} iterations, step cap {bench.config.max_step_tokens} tokens, "
             f"problem batch {bench.config.problem_batch} per replica, T={bench.config.temperature}; "
             f"{bench.rounds} alternating rounds, medians.",
             "problems/min runs from all replicas up to the last result; startup (Ray actor + model load) "
             "is the startup_seconds column.",
             f"{rows[1]['speedup']:.2f}x for 2 replicas of 1 thread, "
             f"{rows[2]['speedup']:.2f}x for 1 replica with 2 threads, over 1 replica of 1 thread.",
             "The machine was shared with other work while this ran (other processes' CPU and memory "
             "load): ratios from alternating rounds, not absolute times, are the result.",
             *CLUSTER_NOTES]
    return write_report("scaleout", "Scale-out with Ray: problems/min by replicas and threads",
                        " ".join(command), summary, rows, notes)
