"""Whether a PRM's tokenizer fits the PRM format it is asked to read, checked once its
tokenizer is known and before any search: where the format would have to guess, refuse.

* A scoring word ("+", "Yes", ...) must be one token: a score is the probability of one
  next token, and a word of several tokens would be judged by its first piece alone,
  which other words may share.
* A format laid out in chat turns (rlhflow, qwen-prm, judge) reads its turn markers off
  the tokenizer's chat template. Without a template, search/prm.py writes Gemma's
  markers; that is right only for a tokenizer that has them as tokens (Gemma's own,
  whose GGUF conversions carry no template), and meaningless text for any other.
"""

from __future__ import annotations

from typing import Any

from search.prompts import encode_text
from tts_runtime.config import ConfigError

# The words each format scores, good first (search/prm.py's `_candidates` calls); qwen-prm
# reads its reward head's classes, not words, unless it is given words.
SCORING_WORDS: dict[str, tuple[str, ...]] = {
    "rlhflow": ("+", "-"),
    "math-shepherd": ("+", "-"),
    "math-shepherd-sal": ("+", "-"),
    "judge": ("Yes", "No"),
    "qwen-prm": (),
}
TURN_FORMATS = frozenset({"rlhflow", "qwen-prm", "judge"})
_NO_TURN_FORMATS = "math-shepherd or math-shepherd-sal"
GEMMA_MARKERS = ("<start_of_turn>", "<end_of_turn>")


def check_scoring_words(format_name: str, model: str, tokenizer: Any, words: tuple[str, ...]) -> None:
    for word in words:
        ids = encode_text(tokenizer, word)
        if len(ids) != 1:
            raise ConfigError(f"PRM {model}: the {format_name} format scores the word {word!r}, which its tokenizer "
                              f"encodes to {len(ids)} tokens {ids}, and a score reads one token; pass another "
                              f"--prm-format whose words are single tokens, or another --prm")


def check_turns(format_name: str, model: str, tokenizer: Any) -> None:
    if format_name not in TURN_FORMATS or getattr(tokenizer, "chat_template", None):
        return
    if all(len(encode_text(tokenizer, marker)) == 1 for marker in GEMMA_MARKERS):
        return  # a Gemma tokenizer without its template: the fallback markers are its own
    raise ConfigError(f"PRM {model}: the {format_name} format lays its input out in chat turns, and the PRM's "
                      f"tokenizer has no chat template to take them from; pass --prm-format {_NO_TURN_FORMATS} "
                      "(no turns), or a PRM folder whose tokenizer has a chat template")


def check_prm_fit(format_name: str, model: str, tokenizer: Any, words: tuple[str, ...] | None = None) -> None:
    """One-line ConfigErrors for a PRM whose tokenizer cannot carry `format_name`.
    `words`: the scoring words when they are not the format's own (qwen-prm's options)."""
    check_turns(format_name, model, tokenizer)
    check_scoring_words(format_name, model, tokenizer, SCORING_WORDS.get(format_name, ()) if words is None else words)
