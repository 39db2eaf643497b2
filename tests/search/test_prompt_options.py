"""Generator prompt options: `system_prompt` and `chat_template` (search-and-learn's
system_prompt and custom_chat_template), on the demo models' real tokenizers."""

from __future__ import annotations

from pathlib import Path

import pytest

from search.config import SearchConfig
from search.prompts import SYSTEM_PROMPT, PromptBuilder
from search.session import SearchSession
from tts_runtime.config import ConfigError

QUESTION = "What is $1+1$?"
TEMPLATE = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


def test_default_is_search_and_learn_system_prompt(smollm) -> None:
    builder = PromptBuilder.configured(smollm, None, None)
    assert builder.system_prompt == SYSTEM_PROMPT
    assert builder.prompt_token_ids(QUESTION) == PromptBuilder(smollm).prompt_token_ids(QUESTION)


def test_system_prompt_replaces_the_default(smollm) -> None:
    text = PromptBuilder.configured(smollm, "Answer in one line.", None).prompt_text(QUESTION)
    assert text.startswith("<|im_start|>system\nAnswer in one line.<|im_end|>\n<|im_start|>user\n" + QUESTION)
    assert SYSTEM_PROMPT not in text
    # An empty system prompt is a choice, not "the default".
    assert PromptBuilder.configured(smollm, "", None).prompt_text(QUESTION).startswith(
        "<|im_start|>system\n<|im_end|>")


def test_chat_template_text_or_file_replaces_the_tokenizers(smollm, tmp_path: Path) -> None:
    expected = f"[system] Be brief.\n[user] {QUESTION}\n[assistant] "
    inline = PromptBuilder.configured(smollm, "Be brief.", TEMPLATE)
    assert inline.prompt_text(QUESTION) == expected
    assert inline.prompt_token_ids(QUESTION) == smollm.encode(expected, add_special_tokens=False)
    path = tmp_path / "template.jinja"
    path.write_text(TEMPLATE)
    from_file = PromptBuilder.configured(smollm, "Be brief.", str(path))
    assert from_file.prompt_token_ids(QUESTION) == inline.prompt_token_ids(QUESTION)
    assert "<|im_start|>" in PromptBuilder.configured(smollm, "Be brief.", None).prompt_text(QUESTION)


def test_bos_once_whether_or_not_the_template_writes_it(gemma) -> None:
    """Gemma's tokenizer adds BOS; a template that leaves it out (as search-and-learn's Llama
    template does, relying on vLLM) gets it added, one that writes it gets it once."""
    bos = gemma.bos_token_id
    without = PromptBuilder.configured(gemma, "Be brief.", TEMPLATE).prompt_token_ids(QUESTION)
    with_bos = PromptBuilder.configured(gemma, "Be brief.", "{{ bos_token }}" + TEMPLATE).prompt_token_ids(QUESTION)
    assert without[0] == bos and without[1] != bos
    assert with_bos == without


def test_bad_chat_template_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--chat-template 'no/such/template.jinja' is neither a Jinja template"):
        SearchConfig(chat_template="no/such/template.jinja")
    plain = tmp_path / "plain.txt"
    plain.write_text("just words")
    with pytest.raises(ConfigError, match="holds no Jinja template") as info:
        SearchConfig(chat_template=str(plain))
    assert "\n" not in str(info.value)


def test_the_search_session_uses_the_options(search_runtime) -> None:
    session = SearchSession(search_runtime, SearchConfig(system_prompt="Be brief.", chat_template=TEMPLATE))
    assert session.prompts.prompt_text(QUESTION) == f"[system] Be brief.\n[user] {QUESTION}\n[assistant] "


def test_continuation_is_the_beam_text_rendered_and_encoded_whole(smollm) -> None:
    """search-and-learn's generator input for a beam (`sal_retokenize`): the assistant turn
    continued with the text, encoded as one string, so the step break is one "\\n\\n" token
    even where the generator sampled "\\n", "\\n"."""
    builder = PromptBuilder(smollm)
    text = builder.continuation_text(QUESTION, "Add them.\n\n")
    assert text == builder.prompt_text(QUESTION) + "Add them.\n\n"
    ids = builder.continuation_token_ids(QUESTION, "Add them.\n\n")
    assert ids == builder.prompt_token_ids(QUESTION) + smollm.encode("Add them.\n\n", add_special_tokens=False)
    assert ids[-1:] == smollm.encode("\n\n", add_special_tokens=False) != smollm.encode("\n", add_special_tokens=False)
