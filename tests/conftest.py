"""Shared fixtures: the real demo models, loaded once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.helpers import GENERATOR, PRM, shared_data_dir
from tts_runtime.models.loader import LoadedModel, load_model

# Triton reads this once, at its first import: without a GPU its kernels run interpreted.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def generator_model() -> LoadedModel:
    return load_model(GENERATOR, torch.float32, torch.device("cpu"))


@pytest.fixture(scope="session")
def prm_model() -> LoadedModel:
    return load_model(PRM, torch.float32, torch.device("cpu"))


@pytest.fixture(scope="session")
def hf_reference():
    """HF transformers models over the same cached weights, for parity checks."""
    from transformers import AutoModelForCausalLM

    cache: dict[str, object] = {}

    def get(loaded: LoadedModel):
        if loaded.name not in cache:
            cache[loaded.name] = AutoModelForCausalLM.from_pretrained(loaded.folder, dtype=torch.float32).eval()
        return cache[loaded.name]

    return get


@pytest.fixture(scope="session")
def search_runtime(generator_model: LoadedModel, prm_model: LoadedModel):
    """The demo generator and PRM co-hosted on one runtime (3 GiB budget), shared by the
    search and CLI tests."""
    from memory.split import MemoryConfig
    from tts_runtime.cohost.runtime import Runtime

    runtime = Runtime(generator_model, prm_model, memory=MemoryConfig(device_memory=3 << 30))
    yield runtime
    runtime.shutdown()


@pytest.fixture(scope="session")
def math500_path() -> Path:
    path = shared_data_dir() / "math500" / "test.jsonl"
    if not path.is_file():
        pytest.skip(f"no MATH-500 copy at {path}")
    return path
