"""Incremental detokenization for stop-string checks.

Decoding a window that starts mid-sequence can drop a leading space or split a
multi-byte character, so each step decodes a short window twice (with and without the
newest tokens) and appends only the difference, holding back text that still ends in a
replacement character (an incomplete UTF-8 sequence).

With a fast tokenizer that leaves spaces as they are, the Rust tokenizer's own
`DecodeStream` does exactly that in one call per token: the transformers `decode` wrapper
costs ~5 us a call (argument conversion in Python), twice per token, which was 15-20% of the
host's work per decode step at 64 sequences (docs/benchmarks/host_lean.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenizers.decoders import DecodeStream


def _uses_decode_stream(tokenizer: object) -> bool:
    """Whether the Rust stream gives the text `tokenizer.decode` would: a fast tokenizer
    without transformers' space clean-up, which the stream does not apply."""
    return getattr(tokenizer, "backend_tokenizer", None) is not None \
        and not getattr(tokenizer, "clean_up_tokenization_spaces", False)


@dataclass
class IncrementalDetokenizer:
    tokenizer: object
    text: str = ""
    _prefix_offset: int = 0
    _read_offset: int = 0
    _ids: list[int] = field(default_factory=list)
    _stream: DecodeStream | None = None

    def __post_init__(self) -> None:
        if _uses_decode_stream(self.tokenizer):
            self._stream = DecodeStream(skip_special_tokens=True)

    def append(self, token_id: int) -> str:
        """Add one token; returns the newly readable text (may be empty)."""
        if self._stream is not None:
            new = self._stream.step(self.tokenizer.backend_tokenizer, token_id) or ""
        else:
            new = self._windowed(token_id)
        self.text += new
        return new

    def _windowed(self, token_id: int) -> str:
        self._ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset:self._read_offset], skip_special_tokens=True)
        full = decode(self._ids[self._prefix_offset:], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return full[len(prefix):]
        return ""
