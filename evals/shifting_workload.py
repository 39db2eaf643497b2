"""A search workload whose memory demand shifts during the run (issue 13 §5).

The steady beam search of the memory sweep keeps the two models' KV demand in a fixed
ratio, so from split 0.3 to 0.7 its throughput is flat and the elastic policy has nothing
to do. This workload runs two phases one after the other on the same runtime:

1. generator-heavy: best-of-N with four times the sweep's `n` samples per problem, each a
   whole solution of up to `max_step_tokens x num_iterations / 2` tokens: many long-lived
   decode sequences, while the PRM scores each finished sample once;
2. PRM-heavy: the sweep's beam search with four times its beams (`n`, the same beam
   width) and twice its iterations of half-length steps: short generator steps, while
   the PRM scores every candidate's growing history every iteration (cheap while the
   surviving histories stay cached, a recompute of each whole history when they are
   evicted, so a small PRM pool costs far more here than in the steady search).

A static split sized for one phase starves the other; the elastic policy can move KV
chunks at the boundary. Each half of the problems runs one phase.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from search.config import SearchConfig
from search.problem import Problem
from tts_runtime.config import ConfigError

WORKLOADS = ("steady", "shifting")


@dataclass(frozen=True)
class WorkloadPhase:
    name: str
    problems: tuple[Problem, ...]
    search: SearchConfig


def workload_phases(workload: str, problems: Sequence[Problem], search: SearchConfig) -> list[WorkloadPhase]:
    """`steady`: the search on every problem; `shifting`: the two phases above."""
    if workload not in WORKLOADS:
        raise ConfigError(f"unknown --workload '{workload}'; choose one of {', '.join(WORKLOADS)}")
    if workload == "steady":
        return [WorkloadPhase("steady", tuple(problems), search)]
    if len(problems) < 2:
        raise ConfigError(f"--workload shifting runs half of the problems in each phase: it needs --limit 2 "
                          f"or more, got {len(problems)}")
    half = max(1, len(problems) // 2)
    generator_heavy = replace(search, method="bon", n=4 * search.n,
                              max_tokens=max(1, search.max_step_tokens * search.num_iterations // 2))
    prm_heavy = replace(search, method="beam", n=4 * search.n, num_iterations=2 * search.num_iterations,
                        max_step_tokens=max(1, search.max_step_tokens // 2))
    return [WorkloadPhase("generator-heavy", tuple(problems[:half]), generator_heavy),
            WorkloadPhase("prm-heavy", tuple(problems[half:]), prm_heavy)]
