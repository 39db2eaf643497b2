"""What the co-hosting policies change, read as counters so that a run reports its own share
(engines and runtimes outlive runs): forwards and their batch sizes per engine, the time
each engine had a forward in flight, and how often the device switched models."""

from __future__ import annotations

from dataclasses import dataclass, fields

from tts_runtime.config import CohostConfig
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.forward_costs import ForwardCostSums


@dataclass(frozen=True)
class EngineCounters:
    forwards: int = 0  # microbatches launched
    sequences: int = 0  # sequences summed over those microbatches
    tokens: int = 0  # tokens computed
    busy_seconds: float = 0.0  # time with a forward in flight (launch to result)
    forward_costs: ForwardCostSums = ForwardCostSums()

    @classmethod
    def read(cls, engine: Engine) -> EngineCounters:
        stats = engine.stats
        return cls(stats.steps, sum(stats.batch_seqs), stats.computed_tokens, engine.busy.seconds,
                   stats.forward_costs)

    def __sub__(self, other: EngineCounters) -> EngineCounters:
        return EngineCounters(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def report(self, seconds: float) -> dict:
        per_forward = (lambda amount: amount / self.forwards) if self.forwards else (lambda amount: 0.0)
        return {"forwards": self.forwards, "mean_batch_seqs": per_forward(self.sequences),
                "mean_batch_tokens": per_forward(self.tokens), "busy_seconds": self.busy_seconds,
                "busy_fraction": self.busy_seconds / seconds if seconds > 0 else 0.0}


@dataclass(frozen=True)
class CohostCounters:
    transitions: int  # times the engine launching a forward differed from the previous one
    busy_seconds: float  # time with a forward of either engine in flight
    generator: EngineCounters
    prm: EngineCounters

    def __sub__(self, other: CohostCounters) -> CohostCounters:
        return CohostCounters(self.transitions - other.transitions, self.busy_seconds - other.busy_seconds,
                              self.generator - other.generator, self.prm - other.prm)

    def report(self, seconds: float, config: CohostConfig) -> dict:
        """For metrics.json: the policy, transitions, the share of `seconds` of wall time with a
        forward of either engine in flight, and per engine its forwards, mean batch (sequences,
        tokens) and busy fraction."""
        return {"phase_policy": config.phase_policy, "overlap": config.overlap,
                "thresholds": {"prm_buffer_tokens": config.prm_buffer_tokens,
                               "generator_low_water": config.generator_low_water,
                               "generator_buffer_seqs": config.generator_buffer_seqs},
                "phase_transitions": self.transitions,
                "busy_fraction": self.busy_seconds / seconds if seconds > 0 else 0.0,
                "generator": self.generator.report(seconds), "prm": self.prm.report(seconds)}
