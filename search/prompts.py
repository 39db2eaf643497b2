"""Generator prompts: the search-and-learn system prompt in the model's own chat format.

A beam is `prompt_ids + step1_ids + step2_ids + ...` where each step's ids are exactly the
tokens the generator sampled. The search never decodes and re-encodes earlier steps: a
BPE tokenizer may split the joined text differently from how it was generated, which
would both change what the model conditions on and break prefix-cache reuse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


@dataclass
class PromptBuilder:
    """Builds the generator's prompt: system prompt + question, assistant turn opened."""

    tokenizer: Any
    system_prompt: str = SYSTEM_PROMPT

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def prompt_text(self, question: str) -> str:
        if self.has_chat_template:
            messages = [
                {"role": "system", "content": self.system_prompt},
                {"role": "user", "content": question},
            ]
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return f"System:\n{self.system_prompt}\n\nUser:\n{question}\n\nAssistant:\n"

    def prompt_token_ids(self, question: str) -> list[int]:
        # A rendered template already carries BOS if the model wants one (HF does the same).
        prefix = [] if self.has_chat_template else bos_ids(self.tokenizer)
        return prefix + encode_text(self.tokenizer, self.prompt_text(question))


def beam_token_ids(prompt_ids: Sequence[int], step_token_ids: Sequence[Sequence[int]]) -> list[int]:
    """The generator input that continues a beam: prompt then each step's sampled ids, verbatim."""
    ids = list(prompt_ids)
    for step in step_token_ids:
        ids.extend(step)
    return ids
