"""Where an engine's host time goes between forwards: perf_counter sums per phase, a few
additions per step (`tts bench host` reads them; docs/benchmarks/host.md).

Phases: `schedule` (the scheduler's pick), `build_inputs` (the model input tensors and the
sample plan), `launch` (submitting to the executor and the step's bookkeeping), `wait` (the
host blocked on a forward's result: device time the host did not hide), `process` (output
processing: block registration, scores, sampling where the driver samples, stop checks,
finished requests; `detokenize` included), `detokenize` (incremental detokenizing for stop
strings)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

PHASES = ("schedule", "build_inputs", "launch", "wait", "process", "detokenize")


@dataclass
class HostTimes:
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    def add(self, phase: str, since: float) -> float:
        """Adds the time since `since` to `phase`; returns now, the next phase's start."""
        now = time.perf_counter()
        self.seconds[phase] += now - since
        return now

    def copy(self) -> HostTimes:
        return HostTimes(dict(self.seconds))

    def __sub__(self, other: HostTimes) -> HostTimes:
        return HostTimes({k: v - other.seconds[k] for k, v in self.seconds.items()})
