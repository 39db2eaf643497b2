"""Incremental detokenization for stop-string checks.

Decoding a window that starts mid-sequence can drop a leading space or split a
multi-byte character, so each step decodes a short window twice (with and without the
newest tokens) and appends only the difference, holding back text that still ends in a
replacement character (an incomplete UTF-8 sequence)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class IncrementalDetokenizer:
    tokenizer: object
    text: str = ""
    _prefix_offset: int = 0
    _read_offset: int = 0
    _ids: list[int] = field(default_factory=list)

    def append(self, token_id: int) -> str:
        """Add one token; returns the newly readable text (may be empty)."""
        self._ids.append(token_id)
        decode = self.tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset:self._read_offset], skip_special_tokens=True)
        full = decode(self._ids[self._prefix_offset:], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            new = full[len(prefix):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            self.text += new
            return new
        return ""
