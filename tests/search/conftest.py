"""Fixtures the search tests share: the demo models' real tokenizers, loaded once per module."""

import pytest

from tests.helpers import GENERATOR, PRM
from tts_runtime.models.loader import load_tokenizer, model_folder


@pytest.fixture(scope="module")
def smollm():
    return load_tokenizer(model_folder(GENERATOR))


@pytest.fixture(scope="module")
def gemma():
    return load_tokenizer(model_folder(PRM))
