"""Converting a GGUF file reads it once: transformers opens it for the tokenizer, the config
and the weights, and the conversion hands all three the first reader."""

from __future__ import annotations

import gguf

from tests.helpers import GENERATOR
from tts_runtime.models.loader import _one_gguf_reader
from tts_runtime.models.registry import resolve


def test_a_conversion_shares_one_reader_per_file():
    path = resolve(GENERATOR).location
    original = gguf.GGUFReader
    with _one_gguf_reader():
        first = gguf.GGUFReader(path)
        assert gguf.GGUFReader(str(path)) is first  # transformers passes a str
        assert isinstance(first, original)
        assert "general.architecture" in first.fields
    assert gguf.GGUFReader is original
    assert original(path) is not first  # outside the block, readers are the library's own again
