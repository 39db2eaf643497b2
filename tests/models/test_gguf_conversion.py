"""Converting a GGUF file: transformers opens it for the tokenizer, the config and the
weights, and the conversion hands all three the first reader; the converted tokenizer lists
its added tokens in tokenizer_config.json, so loading it parses tokenizer.json once less."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest

from tests.helpers import GENERATOR, PRM
from tts_runtime.models.loader import _gguf_cache_dir, _list_added_tokens, _one_gguf_reader, convert_gguf, \
    load_tokenizer, model_folder
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


def _as_an_earlier_tts_converted(source: Path, folder: Path) -> None:
    """`source`'s files (linked; the tokenizer config copied) without the added-token list
    that transformers 5's save_pretrained leaves out."""
    folder.mkdir()
    for path in source.iterdir():
        if path.name != "tokenizer_config.json":
            (folder / path.name).symlink_to(path)
    config = json.loads((source / "tokenizer_config.json").read_text())
    assert config.pop("added_tokens_decoder")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def _tokenizer_json_parses(monkeypatch) -> list[str]:
    """Files json.load reads from here on whose name is tokenizer.json."""
    parsed: list[str] = []
    original = json.load

    def counting(handle, *args, **kwargs):
        if Path(getattr(handle, "name", "")).name == "tokenizer.json":
            parsed.append(handle.name)
        return original(handle, *args, **kwargs)

    monkeypatch.setattr(json, "load", counting)
    return parsed


def _same_tokenizer(a, b, problems: list[str]) -> None:
    for text in problems + ["<bos>x<eos><pad><unk> <|im_start|>user\n1+1<|im_end|>"]:
        assert a(text)["input_ids"] == b(text)["input_ids"]
        assert a(text, add_special_tokens=False)["input_ids"] == b(text, add_special_tokens=False)["input_ids"]
    assert {i: (str(t), t.special, t.normalized) for i, t in a.added_tokens_decoder.items()} == \
           {i: (str(t), t.special, t.normalized) for i, t in b.added_tokens_decoder.items()}
    assert (a.special_tokens_map, a.all_special_ids, a.padding_side, a.chat_template) == \
           (b.special_tokens_map, b.all_special_ids, b.padding_side, b.chat_template)
    assert type(a) is type(b) and a.get_vocab() == b.get_vocab()


@pytest.mark.parametrize("name", [GENERATOR, PRM])
def test_listing_added_tokens_saves_a_parse_and_loads_the_same_tokenizer(name, tmp_path, monkeypatch, math500_path):
    earlier = tmp_path / "earlier"
    _as_an_earlier_tts_converted(model_folder(name), earlier)
    parsed = _tokenizer_json_parses(monkeypatch)
    before = load_tokenizer(earlier)
    unlisted_parses = len(parsed)

    _list_added_tokens(earlier)
    listed = json.loads((earlier / "tokenizer_config.json").read_text())["added_tokens_decoder"]
    added = json.loads((earlier / "tokenizer.json").read_text())["added_tokens"]
    assert [int(i) for i in listed] == [token["id"] for token in added]
    parsed.clear()
    after = load_tokenizer(earlier)
    assert len(parsed) == unlisted_parses - 1

    problems = [json.loads(line)["problem"] for line in math500_path.read_text().splitlines()[:40]]
    _same_tokenizer(before, after, problems)


def test_an_earlier_conversion_in_the_cache_is_listed_when_next_loaded(tmp_path, monkeypatch):
    converted = model_folder(GENERATOR)
    monkeypatch.setenv("TTS_CACHE_DIR", str(tmp_path / "cache"))
    source = resolve(GENERATOR).location
    gguf_file = tmp_path / source.name
    gguf_file.symlink_to(source)
    target = _gguf_cache_dir(gguf_file)
    target.parent.mkdir(parents=True)
    _as_an_earlier_tts_converted(converted, target)

    assert convert_gguf(gguf_file) == target
    assert "added_tokens_decoder" in json.loads((target / "tokenizer_config.json").read_text())
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in converted.iterdir())
