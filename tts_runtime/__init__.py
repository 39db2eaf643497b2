"""tts: a test-time-compute search runtime. Runtime-level API only (the search API lives in `search`)."""

from tts_runtime.config import CacheConfig, ConfigError, EngineConfig, ModelSpec, SchedulerConfig
from tts_runtime.engine.engine import Engine, EngineStats, RequestError
from tts_runtime.engine.request import CompletionOutput, RequestOutput, SamplingParams, ScoreParams

__all__ = [
    "CacheConfig", "CompletionOutput", "ConfigError", "Engine", "EngineConfig", "EngineStats",
    "ModelSpec", "RequestError", "RequestOutput", "SamplingParams", "SchedulerConfig", "ScoreParams",
]
