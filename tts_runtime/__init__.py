"""tts: a test-time-compute search runtime. Runtime-level API only (the search API lives in `search`).

The names load on first use, so `import tts_runtime` (and the `tts` command's start) does not
import torch until something needs it."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CacheConfig": "tts_runtime.config", "ConfigError": "tts_runtime.config", "EngineConfig": "tts_runtime.config",
    "ModelSpec": "tts_runtime.config", "SchedulerConfig": "tts_runtime.config",
    "Engine": "tts_runtime.engine.engine", "EngineStats": "tts_runtime.engine.engine",
    "RequestError": "tts_runtime.engine.request",
    "CompletionOutput": "tts_runtime.engine.request", "RequestOutput": "tts_runtime.engine.request",
    "SamplingParams": "tts_runtime.engine.request", "ScoreParams": "tts_runtime.engine.request",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tts_runtime' has no attribute '{name}'")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
