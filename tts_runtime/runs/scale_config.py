"""How a run spreads over Ray replicas: the plain settings, kept apart from
`tts_runtime.runs.ray_pool` so that parsing them does not import Ray (a second of start-up, and a
package a one-process run on a GPU box need not have)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tts_runtime.config import ConfigError


@dataclass(frozen=True)
class ScaleOut:
    """How a run spreads over Ray: `replicas` actors, each with `threads_per_replica` torch
    threads (CPU) or one GPU; `address` joins a running cluster (None: a local one)."""

    replicas: int = 1
    address: str | None = None
    threads_per_replica: int = 1
    gpus_per_replica: int = 0
    # A replica with problems in flight that answers no heartbeat for this long is hung: it is
    # killed and replaced (one engine step must fit in it; the longest seen on a CPU is ~30 s).
    hang_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.hang_timeout_s > 0:
            raise ConfigError(f"--hang-timeout-s must be > 0, got {self.hang_timeout_s}")
        if self.replicas < 1:
            raise ConfigError(f"--replicas must be >= 1, got {self.replicas}")
        if self.threads_per_replica < 1:
            raise ConfigError(f"--threads-per-replica must be >= 1, got {self.threads_per_replica}")

    def to_dict(self) -> dict[str, Any]:
        return {"replicas": self.replicas, "ray_address": self.address,
                "threads_per_replica": self.threads_per_replica, "gpus_per_replica": self.gpus_per_replica}
