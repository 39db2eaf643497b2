"""Generator prompts: the search-and-learn system prompt in the model's own chat format.

A beam is `prompt_ids + step1_ids + step2_ids + ...` where each step's ids are exactly the
tokens the generator sampled. The search never decodes and re-encodes earlier steps: a
BPE tokenizer may split the joined text differently from how it was generated, which
would both change what the model conditions on and break prefix-cache reuse. Only
`sal_retokenize` does, because search-and-learn does (it sends vLLM the rendered text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tts_runtime.config import ConfigError

SYSTEM_PROMPT = (
    "Solve the following math problem efficiently and clearly:\n\n"
    "- For simple problems (2 steps or fewer):\n"
    "Provide a concise solution with minimal explanation.\n\n"
    "- For complex problems (3 steps or more):\n"
    "Use this step-by-step format:\n\n"
    "## Step 1: [Concise description]\n"
    "[Brief explanation and calculations]\n\n"
    "## Step 2: [Concise description]\n"
    "[Brief explanation and calculations]\n\n"
    "...\n\n"
    "Regardless of the approach, always conclude with:\n\n"
    "Therefore, the final answer is: $\\boxed{answer}$. I hope it is correct.\n\n"
    "Where [answer] is just the final number or expression that solves the problem."
)


def bos_ids(tokenizer: Any) -> list[int]:
    """The BOS id when the tokenizer adds one on plain encoding (Gemma: yes, SmolLM: no).

    Chat templates write their own BOS; only template-less layouts need this."""
    bos = tokenizer.bos_token_id
    probe = tokenizer.encode("a", add_special_tokens=True)
    return [bos] if bos is not None and probe and probe[0] == bos else []


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of `text` on its own; special-token strings in it (`<|im_end|>`) become their ids."""
    return tokenizer.encode(text, add_special_tokens=False)


_TEMPLATE_MARKS = ("{{", "{%")


def load_chat_template(value: str | None) -> str | None:
    """A chat template given as Jinja text, or read from the file `value` names."""
    if value is None or any(mark in value for mark in _TEMPLATE_MARKS):
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ConfigError(f"--chat-template '{value[:60]}' is neither a Jinja template (no {{{{ or {{% in it) "
                          "nor a file; pass the template text or the path of a file holding it")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--chat-template {path}: cannot read it as UTF-8 text ({type(exc).__name__})") from None
    if not any(mark in text for mark in _TEMPLATE_MARKS):
        raise ConfigError(f"--chat-template {path} holds no Jinja template (no {{{{ or {{% in it)")
    return text


@dataclass
class PromptBuilder:
    """Builds the generator's prompt: system prompt + question, assistant turn opened.

    `chat_template` (Jinja text) replaces the tokenizer's own, as search-and-learn's
    `custom_chat_template` does; None keeps the tokenizer's."""

    tokenizer: Any
    system_prompt: str = SYSTEM_PROMPT
    chat_template: str | None = None

    @classmethod
    def configured(cls, tokenizer: Any, system_prompt: str | None, chat_template: str | None) -> PromptBuilder:
        """From the search options: None means the default system prompt / the tokenizer's template."""
        return cls(tokenizer, SYSTEM_PROMPT if system_prompt is None else system_prompt,
                   load_chat_template(chat_template))

    @property
    def template(self) -> str | None:
        return self.chat_template or getattr(self.tokenizer, "chat_template", None) or None

    @property
    def has_chat_template(self) -> bool:
        return self.template is not None

    def prompt_text(self, question: str) -> str:
        if self.has_chat_template:
            messages = [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": question},
            ]
            return self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                                      add_generation_prompt=True)
        return f"System:\n{self.system_prompt}\n\nUser:\n{question}\n\nAssistant:\n"

    def prompt_token_ids(self, question: str) -> list[int]:
        return self._encode(self.prompt_text(question))

    def continuation_text(self, question: str, response: str) -> str:
        """The prompt with `response` as the assistant's unfinished turn (search-and-learn's
        `continue_final_message` rendering of a beam's text)."""
        if self.has_chat_template:
            messages = [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": question},
                {"role": "assistant", "content": response},
            ]
            return self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                                      continue_final_message=True)
        return self.prompt_text(question) + response

    def continuation_token_ids(self, question: str, response: str) -> list[int]:
        """search-and-learn's generator input for a beam (`sal_retokenize`): its text rendered
        and encoded as one string, which may split differently from the sampled tokens (a
        sampled "\n", "\n" is re-encoded as one "\n\n" token), so the model continues from
        other ids."""
        return self._encode(self.continuation_text(question, response))

    def _encode(self, text: str) -> list[int]:
        return self._bos_prefix(text) + encode_text(self.tokenizer, text)

    def _bos_prefix(self, text: str) -> list[int]:
        """BOS where the model wants one and the text does not write it. Templates of BOS
        models usually write it (Llama, Gemma); search-and-learn's Llama template does not,
        relying on vLLM adding BOS when it encodes a text prompt, so it is added here too."""
        bos = bos_ids(self.tokenizer)
        if bos and self.has_chat_template and text.startswith(self.tokenizer.bos_token):
            return []
        return bos


def beam_token_ids(prompt_ids: Sequence[int], step_token_ids: Sequence[Sequence[int]]) -> list[int]:
    """The generator input that continues a beam: prompt then each step's sampled ids, verbatim."""
    ids = list(prompt_ids)
    for step in step_token_ids:
        ids.extend(step)
    return ids
