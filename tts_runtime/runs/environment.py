"""The machine and software a run used: `machine_info` plus the tts version and
the device the models ran on, split into `versions` and `machine`."""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import torch


def machine_info() -> dict:
    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    import transformers

    info["transformers"] = transformers.__version__
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _tts_version() -> str | None:
    try:
        return metadata.version("tts-runtime")
    except metadata.PackageNotFoundError:
        return None


def environment(device: torch.device) -> dict[str, Any]:
    facts = machine_info()
    versions = {name: facts.pop(name) for name in ("python", "torch", "transformers")}
    return {"versions": {**versions, "tts": _tts_version()}, "machine": {"device": str(device), **facts}}
