import json

import pytest

from search.aggregate import AGGREGATIONS, aggregate
from search.beam_state import split_steps
from search.prm_detect import detect_prm_format
from search.prm import (
    PRM_FORMATS,
    QwenPRMFormat,
    ScoreQuery,
    chat_layout,
    make_prm_format,
)
from search.prompts import SYSTEM_PROMPT, PromptBuilder, beam_token_ids
from search.score_cache import ScoreCache
from tts_runtime.config import ConfigError

QUESTION = ("Convert the point $(0,3)$ in rectangular coordinates to polar coordinates. "
            "Enter your answer in the form $(r,\\theta)$.")
STEPS = [
    "## Step 1: Compute the radius\nThe radius is $r = \\sqrt{0^2 + 3^2} = 3$.\n\n",
    # A blank line inside one step, unicode and display math.
    "## Step 2: Compute the angle\nThe point lies on the positive $y$-axis.\n\n"
    "So θ = π/2, i.e. $$\\theta = \\frac{\\pi}{2} \\in [0, 2\\pi).$$ ✓\n\n",
    "## Step 3: Check\n答案: $x = r\\cos\\theta = 3 \\cdot 0 = 0$ and "
    "$y = 3 \\sin \\frac{\\pi}{2} = 3$ — both match 🙂\n\n",
    "Therefore, the final answer is: $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$. I hope it is correct.",
]


@pytest.fixture(scope="module", params=["smollm", "gemma"])
def tokenizer(request):
    return request.getfixturevalue(request.param)


def _decode(tokenizer, ids) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


# --- generator prompts ---------------------------------------------------------------

def test_chat_prompt_ends_with_assistant_opening(smollm):
    ids = PromptBuilder(smollm).prompt_token_ids(QUESTION)
    opening = smollm.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert ids[-len(opening):] == opening
    text = _decode(smollm, ids)
    assert text.startswith("<|im_start|>system\n" + SYSTEM_PROMPT + "<|im_end|>")
    assert "<|im_start|>user\n" + QUESTION + "<|im_end|>" in text


def test_system_prompt_asks_for_steps_and_boxed_answer():
    assert SYSTEM_PROMPT.startswith("Solve the following math problem efficiently and clearly")
    assert "## Step 1:" in SYSTEM_PROMPT
    assert "Therefore, the final answer is: $\\boxed{answer}$. I hope it is correct." in SYSTEM_PROMPT


def test_plain_layout_without_chat_template(gemma):
    assert not gemma.chat_template
    ids = PromptBuilder(gemma).prompt_token_ids(QUESTION)
    assert ids[0] == gemma.bos_token_id
    text = _decode(gemma, ids[1:])
    assert text == f"System:\n{SYSTEM_PROMPT}\n\nUser:\n{QUESTION}\n\nAssistant:\n"


def test_beam_ids_keep_generated_step_ids_verbatim(smollm):
    prompt = PromptBuilder(smollm).prompt_token_ids(QUESTION)
    # Ids a generator could sample that the tokenizer would never produce for this text.
    step1 = [smollm.convert_tokens_to_ids("Ġ")] + smollm.encode("x\n\n", add_special_tokens=False)
    step2 = smollm.encode("y", add_special_tokens=False)
    ids = beam_token_ids(prompt, [step1, step2])
    assert ids == prompt + step1 + step2
    assert ids[: len(prompt)] == prompt


# --- PRM formats ---------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PRM_FORMATS))
def test_prefix_property(tokenizer, name):
    fmt = make_prm_format(name, tokenizer)
    for k in range(1, len(STEPS)):
        shorter = fmt.build(QUESTION, STEPS[:k])
        longer = fmt.build(QUESTION, STEPS[: k + 1])
        shared = shorter.stable_prefix_len
        assert longer.token_ids[:shared] == shorter.token_ids[:shared]
        # The shared part reaches at least the end of step k's text; for the tag/turn
        # formats it is the whole query, scoring marker included.
        shared_text = _decode(tokenizer, shorter.token_ids[:shared])
        if name == "judge":
            assert shared_text.endswith(STEPS[k - 1].strip())
        else:
            assert shared == len(shorter.token_ids)
            assert STEPS[k - 1].strip() in shared_text
        assert longer.stable_prefix_len > shared


@pytest.mark.parametrize("name", sorted(PRM_FORMATS))
def test_query_scores_only_the_last_step_at_the_last_token(tokenizer, name):
    query = make_prm_format(name, tokenizer).build(QUESTION, STEPS)
    assert query.positions == (len(query.token_ids) - 1,)
    assert len(query.candidate_token_ids) == 2
    params = query.score_params()
    assert params.positions == query.positions
    assert params.candidate_token_ids == query.candidate_token_ids


def _expected_rlhflow_text(tokenizer) -> str:
    layout = chat_layout(tokenizer)
    steps = [s.strip() for s in STEPS]
    text = layout.head + QUESTION + " " + steps[0]
    for step in steps[1:]:
        text += layout.user_to_assistant + "+" + layout.assistant_to_user + step
    return text + layout.user_to_assistant


def test_rlhflow_layout(tokenizer):
    fmt = make_prm_format("rlhflow", tokenizer)
    query = fmt.build(QUESTION, STEPS)
    assert _decode(tokenizer, query.token_ids) == _expected_rlhflow_text(tokenizer)
    assert [_decode(tokenizer, [t]) for t in query.candidate_token_ids] == ["+", "-"]
    # The score is read where "+" is predicted: in the longer history the very next token is "+".
    for k in range(1, len(STEPS)):
        shorter = fmt.build(QUESTION, STEPS[:k])
        longer = fmt.build(QUESTION, STEPS[: k + 1])
        assert longer.token_ids[shorter.positions[0] + 1] == query.candidate_token_ids[0]
    assert _decode(tokenizer, [query.token_ids[query.positions[0]]]) == "\n"


def test_rlhflow_turns_smollm(smollm):
    text = _decode(smollm, make_prm_format("rlhflow", smollm).build(QUESTION, STEPS[:2]).token_ids)
    assert text.endswith(
        "<|im_start|>user\n" + QUESTION + " " + STEPS[0].strip() + "<|im_end|>\n"
        "<|im_start|>assistant\n+<|im_end|>\n"
        "<|im_start|>user\n" + STEPS[1].strip() + "<|im_end|>\n<|im_start|>assistant\n"
    )


def test_rlhflow_turns_gemma(gemma):
    text = _decode(gemma, make_prm_format("rlhflow", gemma).build(QUESTION, STEPS[:2]).token_ids)
    assert text == (
        "<bos><start_of_turn>user\n" + QUESTION + " " + STEPS[0].strip() + "<end_of_turn>\n"
        "<start_of_turn>model\n+<end_of_turn>\n"
        "<start_of_turn>user\n" + STEPS[1].strip() + "<end_of_turn>\n<start_of_turn>model\n"
    )


def test_math_shepherd_layout(tokenizer):
    fmt = make_prm_format("math-shepherd", tokenizer)
    query = fmt.build(QUESTION, STEPS)
    body = QUESTION + " " + "\n".join(s.strip() + " ки" for s in STEPS)
    bos = tokenizer.bos_token if query.token_ids[0] == tokenizer.bos_token_id else ""
    assert _decode(tokenizer, query.token_ids) == bos + body
    assert [_decode(tokenizer, [t]) for t in query.candidate_token_ids] == ["+", "-"]
    scored = _decode(tokenizer, [query.token_ids[query.positions[0]]])
    assert scored and " ки".endswith(scored)


def test_math_shepherd_tag_is_one_token_in_gemma(gemma):
    query = make_prm_format("math-shepherd", gemma).build(QUESTION, STEPS[:1])
    assert query.token_ids[0] == gemma.bos_token_id
    assert _decode(gemma, [query.token_ids[query.positions[0]]]) == " ки"


def test_math_shepherd_sal_layout(tokenizer):
    """search-and-learn's input: system prompt, question, then the steps joined by " ки\\n\\n"."""
    query = make_prm_format("math-shepherd-sal", tokenizer).build(QUESTION, STEPS)
    body = SYSTEM_PROMPT + "\n" + QUESTION + "\n " + "\n\n".join(s.strip() + " ки" for s in STEPS)
    bos = tokenizer.bos_token if query.token_ids[0] == tokenizer.bos_token_id else ""
    assert _decode(tokenizer, query.token_ids) == bos + body


# The ids below are written out by hand from each tokenizer's vocabulary.
@pytest.mark.parametrize("name", ["math-shepherd", "math-shepherd-sal"])
def test_math_shepherd_ids_pinned_gemma(gemma, name):
    fmt = make_prm_format(name, gemma)
    assert fmt.candidate_token_ids == (236862, 236772)  # "+", "-"
    assert fmt.tag_id == 13584  # "▁ки": the whole " ки" is one token
    query = fmt.build(QUESTION, STEPS[:2])
    assert query.token_ids[query.positions[0]] == 13584


@pytest.mark.parametrize("name", ["math-shepherd", "math-shepherd-sal"])
def test_math_shepherd_ids_pinned_smollm(smollm, name):
    fmt = make_prm_format(name, smollm)
    assert fmt.candidate_token_ids == (27, 29)  # "+", "-"
    assert fmt.tag_id == 7872  # " ки" is "Ġк" + "и": the score sits on "и"
    query = fmt.build(QUESTION, STEPS[:2])
    assert query.token_ids[query.positions[0] - 1:query.positions[0] + 1] == [31338, 7872]


@pytest.fixture(scope="module")
def sentencepiece_like():
    """A word-level tokenizer with SentencePiece's Metaspace pre-tokenizer: every separately
    encoded piece starts with "▁", as Llama-2 / Mistral (Math-Shepherd's base) tokenizers do."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "▁ки", "ки", "▁+", "▁-", "+", "-", "▁What", "▁is", "▁2+2?",
             "▁Step", "▁1:", "▁4", "▁done"]
    model = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    model.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("name", ["math-shepherd", "math-shepherd-sal"])
def test_math_shepherd_sentencepiece_pieces(sentencepiece_like, name):
    fmt = make_prm_format(name, sentencepiece_like)
    assert fmt.candidate_token_ids == (5, 6)  # "▁+", "▁-": what follows a space
    assert fmt.tag_id == 3  # "▁ки"
    steps = ["Step 1: 4\n\n", "done"]
    one, two = fmt.build("What is 2+2?", steps[:1]), fmt.build("What is 2+2?", steps)
    assert one.token_ids[one.positions[0]] == two.token_ids[two.positions[0]] == 3
    assert two.token_ids[:len(one.token_ids)] == one.token_ids  # the first step's tag is reused
    # Then the joiner + "done" (one word, not in this vocabulary: <unk>) and the tag.
    assert two.token_ids[len(one.token_ids):] == [0, 3]


def test_qwen_prm_layout(tokenizer):
    fmt = make_prm_format("qwen-prm", tokenizer)
    query = fmt.build(QUESTION, STEPS)
    layout = chat_layout(tokenizer, system=QwenPRMFormat.system_prompt)
    expected = layout.head + QUESTION + layout.user_to_assistant + "".join(s.strip() + "<extra_0>" for s in STEPS)
    assert _decode(tokenizer, query.token_ids) == expected
    assert query.candidate_token_ids == (1, 0)  # the reward head's classes, good first
    # Neither demo tokenizer has <extra_0> as one token: the score sits on its last token.
    assert _decode(tokenizer, [query.token_ids[query.positions[0]]]) == ">"


def test_qwen_prm_configured_candidates(gemma):
    fmt = make_prm_format("qwen-prm", gemma, good="Yes", bad="No")
    assert [_decode(gemma, [t]) for t in fmt.candidate_token_ids] == ["Yes", "No"]


def test_judge_layout(tokenizer):
    fmt = make_prm_format("judge", tokenizer)
    query = fmt.build(QUESTION, STEPS)
    text = _decode(tokenizer, query.token_ids)
    layout = chat_layout(tokenizer)
    assert text.startswith(layout.head + fmt.instruction + QUESTION)
    steps_text = "".join("\n\n" + s.strip() for s in STEPS)
    assert text.endswith(steps_text + fmt.ask + layout.user_to_assistant)
    assert _decode(tokenizer, query.token_ids[: query.stable_prefix_len]).endswith(steps_text)
    assert [_decode(tokenizer, [t]) for t in query.candidate_token_ids] == ["Yes", "No"]
    assert _decode(tokenizer, [query.token_ids[query.positions[0]]]) == "\n"


def test_judge_uses_gemma_turns_without_template(gemma):
    text = _decode(gemma, make_prm_format("judge", gemma).build(QUESTION, STEPS[:1]).token_ids)
    assert text.startswith("<bos><start_of_turn>user\n")
    assert text.endswith("Answer Yes or No.<end_of_turn>\n<start_of_turn>model\n")


def test_gemma_turn_markers_are_single_tokens(gemma):
    query = make_prm_format("judge", gemma).build(QUESTION, STEPS[:1])
    assert query.token_ids[:2] == [gemma.bos_token_id, gemma.convert_tokens_to_ids("<start_of_turn>")]
    assert gemma.convert_tokens_to_ids("<end_of_turn>") in query.token_ids


def test_to_score():
    query = ScoreQuery([1, 2], (1,), (5, 6), 2)
    assert query.to_score([0.8, 0.2]) == pytest.approx(0.8)
    assert query.to_score([0.3, 0.1]) == pytest.approx(0.75)
    assert query.to_score([0.0, 0.0]) == 0.0
    assert PRM_FORMATS["judge"].to_score([0.25, 0.75]) == pytest.approx(0.25)


def test_build_needs_a_step(smollm):
    with pytest.raises(ValueError, match="at least one step"):
        make_prm_format("judge", smollm).build(QUESTION, [])


def test_unknown_format_lists_known_names(smollm):
    with pytest.raises(ConfigError) as error:
        make_prm_format("nope", smollm)
    message = str(error.value)
    assert "\n" not in message
    assert "'nope'" in message
    for name in ("judge", "math-shepherd", "qwen-prm", "rlhflow"):
        assert name in message


@pytest.mark.parametrize("model, expected", [
    ("gemma3-270m", "judge"),
    ("smollm2-135m-instruct", "judge"),
    ("dummy:llama-3.1-8b", "judge"),
    ("RLHFlow/Llama3.1-8B-PRM-Deepseek-Data", "rlhflow"),
    ("RLHFlow/Llama3.1-8B-PRM-Mistral-Data", "rlhflow"),
    ("peiyi9979/math-shepherd-mistral-7b-prm", "math-shepherd-sal"),
    ("Qwen/Qwen2.5-Math-PRM-7B", "qwen-prm"),
])
def test_detect_prm_format_by_name(model, expected):
    assert detect_prm_format(model) == expected


def _checkpoint(folder, **config):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return str(folder)


def test_detect_prm_format_reads_the_checkpoint_not_the_path(tmp_path):
    # A local copy of RLHFlow's PRM under its repository's name: no "rlhflow" in the path.
    assert detect_prm_format(_checkpoint(tmp_path / "Llama3.1-8B-PRM-Deepseek-Data")) == "rlhflow"
    assert detect_prm_format(_checkpoint(tmp_path / "my-prm", _name_or_path="RLHFlow/Llama3.1-8B-PRM-Mistral-Data")) \
        == "rlhflow"
    assert detect_prm_format(_checkpoint(tmp_path / "q", architectures=["Qwen2ForProcessRewardModel"])) == "qwen-prm"
    with pytest.raises(ConfigError, match=r"cannot tell which PRM format .*unknown-llm expects.*pass --prm-format"):
        detect_prm_format(_checkpoint(tmp_path / "unknown-llm", architectures=["LlamaForCausalLM"]))
    with pytest.raises(ConfigError, match="Skywork's value head, which tts does not read yet"):
        detect_prm_format("Skywork/Skywork-o1-Open-PRM-Qwen-2.5-1.5B")


# --- score cache ---------------------------------------------------------------------

def test_score_cache_counters():
    cache = ScoreCache()
    assert cache.hit_rate == 0.0
    assert cache.get("judge", "p1", STEPS[:1]) is None
    cache.put("judge", "p1", STEPS[:1], 0.7)
    assert cache.get("judge", "p1", list(STEPS[:1])) == 0.7
    assert cache.get("judge", "p1", STEPS[:2]) is None  # a longer prefix is a different key
    assert cache.get("judge", "p2", STEPS[:1]) is None  # another problem
    assert cache.get("rlhflow", "p1", STEPS[:1]) is None  # another PRM
    assert cache.get("judge", "p1", [STEPS[0].strip()]) is None  # texts must match exactly
    assert (cache.hits, cache.misses) == (1, 5)
    assert cache.hit_rate == pytest.approx(1 / 6)
    cache.put("judge", "p2", STEPS[:1], 0.1)
    assert len(cache) == 2
    cache.drop_problem("p1")
    assert len(cache) == 1
    assert cache.get("judge", "p2", STEPS[:1]) == 0.1


# --- aggregation ---------------------------------------------------------------------

@pytest.mark.parametrize("method, expected", [("last", 0.5), ("min", 0.25), ("prod", 0.1), ("mean", 1.55 / 3)])
def test_aggregate(method, expected):
    assert aggregate([0.8, 0.25, 0.5], method) == pytest.approx(expected)


@pytest.mark.parametrize("method", AGGREGATIONS)
def test_aggregate_empty_is_zero(method):
    assert aggregate([], method) == 0.0


def test_aggregate_unknown_method():
    with pytest.raises(ConfigError, match="unknown score aggregation 'max'; choose one of last, min, prod, mean"):
        aggregate([0.5], "max")


# --- search-and-learn's PRM inputs (sal_empty_step, sal_whole_string) -------------------

# A beam's text as generated mid-search: steps that end in the "\n\n" stop string.
SAL_TEXT = STEPS[0] + STEPS[2]


def _sal_math_shepherd_input(question: str, text: str) -> str:
    """search-and-learn's Math-Shepherd input string for one beam, rebuilt from its rules:
    system prompt, question, " ", each "\\n\\n" turned into " ки\\n\\n", a final tag if missing."""
    body = text.replace("\n\n", " ки\n\n")
    if body[-2:] != "\n\n":
        body += " ки"
    return f"{SYSTEM_PROMPT}\n{question}\n {body}"


@pytest.fixture(scope="module")
def sentencepiece_unigram():
    """A SentencePiece-style unigram tokenizer: spaces become "▁" and every encode call starts
    with "▁" (Metaspace, prepend "always"), as Mistral's (Math-Shepherd's base) does."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    text = _sal_math_shepherd_input(QUESTION, SAL_TEXT + STEPS[3])
    chars = sorted(set(text.replace(" ", "▁")) | {"▁", "+", "-"})
    pieces = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), ("▁ки", -1.0), ("▁+", -1.0), ("▁-", -1.0)]
    pieces += [(c, -10.0) for c in chars if c not in {"<unk>", "<s>", "</s>"}]
    model = Tokenizer(models.Unigram(pieces, unk_id=0, byte_fallback=False))
    model.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    from tokenizers.processors import TemplateProcessing
    model.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=model, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.mark.parametrize("which", ["smollm", "gemma", "sentencepiece_unigram"])
def test_math_shepherd_whole_string_is_search_and_learns_tokenization(request, which):
    tokenizer = request.getfixturevalue(which)
    steps = split_steps(SAL_TEXT + STEPS[3])
    whole = make_prm_format("math-shepherd-sal", tokenizer, whole_string=True)
    sal_ids = tokenizer(_sal_math_shepherd_input(QUESTION, SAL_TEXT + STEPS[3]))["input_ids"]
    tags = [i for i, token in enumerate(sal_ids) if token == whole.tag_id]
    assert len(tags) == len(steps)
    for k in range(1, len(steps) + 1):  # every prefix: search-and-learn's ids up to its k-th tag
        query = whole.build(QUESTION, steps[:k])
        assert query.positions == (tags[k - 1],)
        assert query.token_ids == sal_ids[:tags[k - 1] + 1]
    pieces = make_prm_format("math-shepherd-sal", tokenizer).build(QUESTION, steps)
    if which == "sentencepiece_unigram":  # pieces: an extra "▁" where each piece starts
        assert pieces.token_ids != whole.build(QUESTION, steps).token_ids
        assert len(pieces.token_ids) > len(whole.build(QUESTION, steps).token_ids)


def _sal_rlhflow_text(tokenizer, question: str, text: str) -> str:
    """search-and-learn's RLHFlow conversation, rendered up to where its last score is read
    (the "+" of the last assistant turn is the predicted token)."""
    conversation = []
    for k, piece in enumerate(text.split("\n\n")):
        conversation.append({"role": "user", "content": question + " " + piece if k == 0 else piece})
        conversation.append({"role": "assistant", "content": "+"})
    conversation[-1]["content"] = "ки"  # marks the last reply (its text before is the same)
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False)
    return rendered[:rendered.rindex("ки")]


def _sal_qwen_text(tokenizer, question: str, text: str) -> str:
    messages = [{"role": "system", "content": QwenPRMFormat.system_prompt},
                {"role": "user", "content": question},
                {"role": "assistant", "content": text.replace("\n\n", "<extra_0>") + "<extra_0>"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    return rendered[:rendered.rindex("<extra_0>") + len("<extra_0>")]


@pytest.mark.parametrize("name, sal_text", [("rlhflow", _sal_rlhflow_text), ("qwen-prm", _sal_qwen_text)])
def test_trailing_empty_step_is_search_and_learns_last_input(smollm, name, sal_text):
    """A mid-search text ends in "\\n\\n"; search-and-learn's split gives a last, empty step,
    and that step's input is what tts builds for the steps plus "" (`sal_empty_step`). SmolLM2's chat
    template renders search-and-learn's conversation (the demo Gemma has none)."""
    tokenizer = smollm
    fmt = make_prm_format(name, tokenizer)
    assert fmt.sal_scores_empty_step
    steps = split_steps(SAL_TEXT)
    query = fmt.build(QUESTION, [*steps, ""])
    assert _decode(tokenizer, query.token_ids) == sal_text(tokenizer, QUESTION, SAL_TEXT)
    assert _decode(tokenizer, fmt.build(QUESTION, steps).token_ids) == sal_text(tokenizer, QUESTION, SAL_TEXT[:-2])
    for other in ("math-shepherd", "math-shepherd-sal", "judge"):
        assert not PRM_FORMATS[other].sal_scores_empty_step


# A search iteration's queries: every prefix of a beam, siblings sharing steps, one whole
# new step, and the empty step search-and-learn scores after a trailing delimiter.
WAVE = [STEPS[:1], STEPS[:2], STEPS[:3], STEPS, [STEPS[0], STEPS[2]], [*STEPS[:2], ""], ["ok"], [" x\n\n y "]]


def _format_options(name: str) -> list[dict]:
    return [{}, {"whole_string": True}] if name.startswith("math-shepherd") else [{}]


@pytest.mark.parametrize("name", sorted(PRM_FORMATS))
def test_batched_tokenization_gives_the_same_queries(tokenizer, name):
    """`build_many` tokenizes a wave's new pieces in one call; every query must equal
    `build` on a format that tokenized each piece on its own (a fresh instance, nothing
    cached), token for token, in every format and in Math-Shepherd's whole-string mode."""
    for options in _format_options(name):
        batched = make_prm_format(name, tokenizer, **options)
        many = batched.build_many(QUESTION, WAVE)
        # A second wave reuses the first's pieces and adds new ones.
        later = batched.build_many(QUESTION, [[*step, "Next step."] for step in WAVE[:3]])
        for steps, query in [*zip(WAVE, many), *zip([[*s, "Next step."] for s in WAVE[:3]], later)]:
            assert query == make_prm_format(name, tokenizer, **options).build(QUESTION, steps), (options, steps)


@pytest.mark.parametrize("name", ["math-shepherd", "math-shepherd-sal"])
def test_batched_tokenization_keeps_sentencepiece_piece_starts(sentencepiece_like, name):
    steps = [["Step 1: 2+2?"], ["Step 1: 2+2?", "4 done"]]
    fmt = make_prm_format(name, sentencepiece_like)
    assert fmt.build_many("What is 2+2?", steps) == [make_prm_format(name, sentencepiece_like).build("What is 2+2?", s)
                                                    for s in steps]
