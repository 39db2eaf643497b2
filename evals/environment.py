"""The machine and software a run used, recorded beside every result."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any

import torch


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def versions() -> dict[str, str | None]:
    return {"python": sys.version.split()[0], "torch": torch.__version__,
            "transformers": _version("transformers"), "tts": _version("tts-runtime")}


def machine(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": str(device), "platform": platform.platform(), "cpu": _cpu_name(),
                            "cpu_count": os.cpu_count(),
                            "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info
