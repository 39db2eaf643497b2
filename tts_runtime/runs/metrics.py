"""Run metrics: accuracy (overall, per level, by vote) and throughput with cache hit rates.

Engine counters are cumulative over a runtime's life, so a run reads them before and after
and reports the difference (a runtime may serve several runs).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from search.results import ProblemResult
from search.score_cache import ScoreCache
from tts_runtime.cohost.runtime import Runtime


@dataclass(frozen=True)
class EngineCounters:
    steps: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    computed_tokens: int = 0
    generated_tokens: int = 0

    @classmethod
    def read(cls, engine: Any) -> EngineCounters:
        return cls(**{f.name: getattr(engine.stats, f.name) for f in fields(cls)})

    def __sub__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    @property
    def prefix_hit_rate(self) -> float:
        """Share of prompt tokens served from the prefix cache."""
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True)
class RunCounters:
    generator: EngineCounters
    prm: EngineCounters
    cache_hits: int
    cache_misses: int

    @classmethod
    def read(cls, runtime: Runtime, cache: ScoreCache) -> RunCounters:
        return cls(EngineCounters.read(runtime.generator), EngineCounters.read(runtime.prm),
                   cache.hits, cache.misses)

    def __sub__(self, other: RunCounters) -> RunCounters:
        return RunCounters(self.generator - other.generator, self.prm - other.prm,
                           self.cache_hits - other.cache_hits, self.cache_misses - other.cache_misses)

    @property
    def cache_hit_rate(self) -> float:
        lookups = self.cache_hits + self.cache_misses
        return self.cache_hits / lookups if lookups else 0.0


def _rate(results: Sequence[ProblemResult], attribute: str) -> float:
    return sum(bool(getattr(r, attribute)) for r in results) / len(results) if results else 0.0


def accuracy(results: Sequence[ProblemResult]) -> dict[str, Any]:
    by_level: dict[str, list[ProblemResult]] = defaultdict(list)
    for result in results:
        by_level[str(result.level) if result.level is not None else "none"].append(result)
    return {
        "problems": len(results),
        "accuracy": _rate(results, "correct"),
        "weighted_accuracy": _rate(results, "weighted_correct"),
        "majority_accuracy": _rate(results, "majority_correct"),
        "per_level": {level: {"problems": len(group), "accuracy": _rate(group, "correct")}
                      for level, group in sorted(by_level.items())},
    }


def throughput(results: Sequence[ProblemResult], seconds: float, work: RunCounters) -> dict[str, Any]:
    """Rates over the problems this session solved (a resumed run's earlier ones excluded)."""
    def per_s(amount: float) -> float:
        return amount / seconds if seconds > 0 else 0.0

    return {
        "problems": len(results),
        "seconds": seconds,
        "problems_per_s": per_s(len(results)),
        "problems_per_min": 60 * per_s(len(results)),
        "generated_tokens": sum(r.generated_tokens for r in results),
        "generator_tokens_per_s": per_s(sum(r.generated_tokens for r in results)),
        "prm_tokens": sum(r.prm_tokens for r in results),
        "prm_tokens_per_s": per_s(sum(r.prm_tokens for r in results)),
        "prefix_hit_rate": {"generator": work.generator.prefix_hit_rate, "prm": work.prm.prefix_hit_rate},
        "speculation": speculation(results, seconds),
        "score_cache": {"hits": work.cache_hits, "misses": work.cache_misses, "hit_rate": work.cache_hit_rate},
        "engine": {"generator": vars(work.generator), "prm": vars(work.prm)},
    }


def speculation(results: Sequence[ProblemResult], seconds: float) -> dict[str, Any]:
    """Speculative beam extension: tokens of speculative steps, kept (used by the search) and
    discarded; goodput counts only tokens the search used (discarded speculation is waste)."""
    useful = sum(r.generated_tokens for r in results)
    return {
        "tokens": sum(r.speculative_tokens for r in results),
        "kept_tokens": sum(r.speculative_kept_tokens for r in results),
        "discarded_tokens": sum(r.speculative_discarded_tokens for r in results),
        "goodput_tokens_per_s": useful / seconds if seconds > 0 else 0.0,
    }


def run_metrics(all_results: Sequence[ProblemResult], new_results: Sequence[ProblemResult],
                seconds: float, work: RunCounters, memory: dict[str, Any],
                cohost: dict[str, Any] | None = None) -> dict[str, Any]:
    """`memory`: the runtime's memory report (plan, prefix-cache and thrash per model);
    `cohost`: the run's phase transitions, batch sizes and busy fractions per engine."""
    metrics = {**accuracy(all_results), "throughput": throughput(new_results, seconds, work), "memory": memory}
    return metrics if cohost is None else {**metrics, "cohost": cohost}
