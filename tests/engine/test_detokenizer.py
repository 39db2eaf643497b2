"""The incremental detokenizer gives, token by token, the text the tokenizer decodes at once,
on both demo tokenizers and real MATH-500 solutions, through the Rust stream and through the
windowed decode it falls back to."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tts_runtime.engine.detokenizer import IncrementalDetokenizer
from tts_runtime.models.loader import LoadedModel

# Multi-byte characters split over byte-level tokens, SentencePiece spaces, a special token.
_HARD_TEXT = "Let $x = \\pi$ — so √2 ≈ 1.41 😀 and 日本語.  Two  spaces\n\n## Step 2:"


def _texts(math500_path: Path) -> list[str]:
    rows = [json.loads(line) for line in math500_path.read_text().splitlines()[:25]]
    return [row["solution"] for row in rows] + [_HARD_TEXT]


def _stream_text(detokenizer: IncrementalDetokenizer, ids: list[int]) -> str:
    pieces = [detokenizer.append(token) for token in ids]
    assert "".join(pieces) == detokenizer.text
    assert not any("\ufffd" in piece for piece in pieces), "a split character was let out"
    return detokenizer.text


@pytest.mark.parametrize("model", ["generator_model", "prm_model"])
def test_incremental_text_is_the_whole_decode(model: str, math500_path: Path, request) -> None:
    tokenizer = request.getfixturevalue(model).tokenizer
    for text in _texts(math500_path):
        ids = tokenizer.encode(text, add_special_tokens=False)
        detokenizer = IncrementalDetokenizer(tokenizer)
        assert detokenizer._stream is not None  # both demo tokenizers take the Rust stream
        assert _stream_text(detokenizer, ids) == tokenizer.decode(ids, skip_special_tokens=True)


def test_the_windowed_fallback_gives_the_same_text(generator_model: LoadedModel, math500_path: Path) -> None:
    tokenizer = generator_model.tokenizer
    for text in _texts(math500_path):
        ids = tokenizer.encode(text, add_special_tokens=False)
        streamed = _stream_text(IncrementalDetokenizer(tokenizer), ids)
        windowed = IncrementalDetokenizer(tokenizer)
        windowed._stream = None
        assert _stream_text(windowed, ids) == streamed


def test_a_tokenizer_that_cleans_up_spaces_is_decoded_by_transformers(generator_model: LoadedModel) -> None:
    """The Rust stream does not apply transformers' clean-up (" ." -> ".", which transformers
    itself may skip for BPE): such a tokenizer keeps the windowed decode, whose text is the
    tokenizer's own decode."""
    tokenizer = copy.deepcopy(generator_model.tokenizer)
    tokenizer.clean_up_tokenization_spaces = True
    ids = tokenizer.encode("The answer is 5 . Done !", add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert detokenizer._stream is None
    assert _stream_text(detokenizer, ids) == tokenizer.decode(ids, skip_special_tokens=True)
