"""The machine and software a run used: `evals.bench.machine_info` plus the tts version and
the device the models ran on, split into `versions` and `machine`."""

from __future__ import annotations

from importlib import metadata
from typing import Any

import torch

from evals.bench import machine_info


def _tts_version() -> str | None:
    try:
        return metadata.version("tts-runtime")
    except metadata.PackageNotFoundError:
        return None


def environment(device: torch.device) -> dict[str, Any]:
    facts = machine_info()
    versions = {name: facts.pop(name) for name in ("python", "torch", "transformers")}
    return {"versions": {**versions, "tts": _tts_version()}, "machine": {"device": str(device), **facts}}
