"""PRM input formats: how (question, steps so far) becomes one engine score request.

Every format scores only the LAST step: the query ends at that step's scoring position
(the token whose next-token distribution carries the verdict), and earlier steps' scores
come from the score cache. The query is built from separately tokenized pieces (fixed
layout text, the question, each step), never from the whole conversation as one string,
so the ids for steps 1..k are identical whether k or k+1 steps are sent: the engine's
prefix cache then reuses everything except the new step. Piece boundaries sit at
whitespace or special tokens, where byte-level BPE pre-tokenizers split anyway,
so the pieces mostly tokenize as the whole text would. (A SentencePiece tokenizer that
prepends a dummy space to every encode call, like Llama 2 / Mistral, puts an extra "▁"
at each piece start; the scoring positions stay right.)

Step texts are stripped of surrounding whitespace: the generator's steps end in the
"\\n\\n" stop string, and the layouts below supply their own separators.

Layouts (`|` marks piece boundaries, `^` the scoring position, i.e. the last token):

* rlhflow:  head question| step1|<u→a>^   and with more steps
            head question| step1|<u→a>|+<a→u>|step2|<u→a>^  (each step a user turn, the
            assistant answered "+"; "+" vs "-" is predicted after the assistant opening).
* math-shepherd:  [bos]question| step1| ки|\\nstep2| ки^  ("+" vs "-" at the tag).
* math-shepherd-sal:  [bos]system\\nquestion\\n| step1| ки|\\n\\nstep2| ки^  (search-and-learn's input).
* qwen-prm: head(system, question, assistant opening)|step1|<extra_0>|step2|<extra_0>^
            (the score is the reward head's class 1 at the separator, not an LM-head token)
* judge:    head instruction question heading|\\n\\nstep1|\\n\\nstep2|\\n\\n<ask Yes/No><u→a>^
            Only the part up to the newest step is shared with the next call; the final
            question and assistant opening come after it.

Turn markers come from the tokenizer's chat template; a tokenizer without one gets
Gemma's turn format (`<start_of_turn>user\\n…<end_of_turn>\\n<start_of_turn>model\\n`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from search.prompts import SYSTEM_PROMPT, bos_ids, encode_text
from tts_runtime.config import ConfigError
from tts_runtime.engine.request import ScoreParams

# Enough for every step of a few hundred beams in flight; a hit saves re-tokenizing a step
# that a beam re-sends on every iteration.
_PIECE_CACHE_SIZE = 1 << 16


def score_from_probs(probs_at_position: Sequence[float]) -> float:
    """Probability mass of the "good" candidate (index 0) among all candidates, in [0, 1]."""
    total = sum(probs_at_position)
    return probs_at_position[0] / total if total > 0 else 0.0


@dataclass(frozen=True)
class ScoreQuery:
    """One PRM score request for the last step of a partial solution.

    `stable_prefix_len` leading ids are guaranteed to reappear unchanged in the query for
    the same question with one more step appended (the prefix-cache contract)."""

    token_ids: list[int]
    positions: tuple[int, ...]
    candidate_token_ids: tuple[int, ...]
    stable_prefix_len: int

    def to_score(self, probs_at_position: Sequence[float]) -> float:
        return score_from_probs(probs_at_position)

    def score_params(self) -> ScoreParams:
        return ScoreParams(positions=self.positions, candidate_token_ids=self.candidate_token_ids)


def candidate_token_id(tokenizer: Any, word: str) -> int:
    """The id scored for `word`. A word that is several tokens is scored by its first token:
    that is where the model commits to it (all later tokens are conditioned on it)."""
    ids = encode_text(tokenizer, word)
    if not ids:
        raise ConfigError(f"candidate word {word!r} encodes to no tokens")
    return ids[0]


def _candidates(tokenizer: Any, good: str, bad: str) -> tuple[int, int]:
    ids = (candidate_token_id(tokenizer, good), candidate_token_id(tokenizer, bad))
    if ids[0] == ids[1]:
        raise ConfigError(f"candidate words {good!r} and {bad!r} start with the same token {ids[0]}")
    return ids


def bos_text(tokenizer: Any) -> str:
    return tokenizer.bos_token if bos_ids(tokenizer) else ""


@dataclass(frozen=True)
class ChatLayout:
    """Turn markers of a chat format, as text."""

    head: str  # everything before the first user message's content (BOS, system turn, user opening)
    user_to_assistant: str  # closes a user turn and opens the assistant's (generated) reply
    assistant_to_user: str  # closes an assistant turn and opens the next user turn
    # Whether a past assistant turn opens exactly like a generated one (multi-turn prefix reuse).
    consistent_turns: bool = True


_SENTINELS = ("TTSSENTINELUSERONE", "TTSSENTINELASSISTANT", "TTSSENTINELUSERTWO")

GEMMA_USER_TO_MODEL = "<end_of_turn>\n<start_of_turn>model\n"
GEMMA_MODEL_TO_USER = "<end_of_turn>\n<start_of_turn>user\n"


def chat_layout(tokenizer: Any, system: str | None = None) -> ChatLayout:
    """Turn markers read off the tokenizer's chat template by rendering placeholder messages."""
    if not getattr(tokenizer, "chat_template", None):
        system_part = f"{system}\n\n" if system else ""
        head = f"{bos_text(tokenizer)}<start_of_turn>user\n{system_part}"
        return ChatLayout(head, GEMMA_USER_TO_MODEL, GEMMA_MODEL_TO_USER)
    user1, assistant, user2 = _SENTINELS
    messages = [{"role": "system", "content": system}] if system else []
    messages += [
        {"role": "user", "content": user1},
        {"role": "assistant", "content": assistant},
        {"role": "user", "content": user2},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    head, past_opening, assistant_to_user, generation_opening = _split_on_sentinels(text)
    return ChatLayout(head, generation_opening, assistant_to_user, past_opening == generation_opening)


def _split_on_sentinels(text: str) -> list[str]:
    parts: list[str] = []
    rest = text
    for sentinel in _SENTINELS:
        before, found, rest = rest.partition(sentinel)
        if not found or sentinel in rest:
            raise ConfigError("the PRM's chat template does not render message contents verbatim; "
                              "pick a format that needs no turns (math-shepherd)")
        parts.append(before)
    parts.append(rest)
    return parts


class PRMFormat(ABC):
    """Turns (question, steps) into a `ScoreQuery` for the last step."""

    name: ClassVar[str]
    # True: the candidates are a reward head's classes, not vocabulary ids (the model must
    # have that head, and no other format can read such a model).
    reads_reward_head: bool = False
    # search-and-learn splits a beam's text on "\n\n" and scores every piece: a text that ends
    # in the delimiter gets one more, empty step in this format (not in Math-Shepherd's, whose
    # input turns each "\n\n" into a tag). tts reproduces it only under `sal_empty_step`.
    sal_scores_empty_step: ClassVar[bool] = False
    candidate_token_ids: tuple[int, ...]
    # Whether `build_many` tokenizes its new pieces in one call (a format whose queries are
    # not made of cached pieces has nothing to gain).
    batch_tokenize: bool = True

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._pieces_ids: OrderedDict[str, tuple[int, ...]] = OrderedDict()  # least recently used first

    def _encode(self, text: str) -> tuple[int, ...]:
        ids = self._pieces_ids.get(text)
        if ids is None:
            ids = tuple(encode_text(self.tokenizer, text))
            self._remember(text, ids)
        else:
            self._pieces_ids.move_to_end(text)
        return ids

    def _remember(self, text: str, ids: tuple[int, ...]) -> None:
        self._pieces_ids[text] = ids
        if len(self._pieces_ids) > _PIECE_CACHE_SIZE:
            self._pieces_ids.popitem(last=False)

    def _encode_new(self, texts: Iterable[str]) -> None:
        """Tokenize the pieces not cached yet in one batched call: a search builds hundreds
        of queries per iteration, each with one new step, and a tokenizer call's own overhead
        was most of the cost of tokenizing one step. The batched call encodes each text on
        its own, exactly as `encode_text` does (tests/search/test_prompts_prm.py)."""
        new = [text for text in dict.fromkeys(texts) if text not in self._pieces_ids]
        if new:
            for text, ids in zip(new, self.tokenizer(new, add_special_tokens=False)["input_ids"], strict=True):
                self._remember(text, tuple(ids))

    def build_many(self, question: str, prefixes: Sequence[Sequence[str]]) -> list[ScoreQuery]:
        """`build` of each prefix, the pieces they have not shared with earlier queries
        tokenized together first."""
        if self.batch_tokenize:
            self._encode_new(piece for steps in prefixes if steps
                             for part in self._pieces(question, [step.strip() for step in steps]) for piece in part)
        return [self.build(question, steps) for steps in prefixes]

    @abstractmethod
    def _pieces(self, question: str, steps: list[str]) -> tuple[list[str], list[str]]:
        """(pieces shared with the next step's query, pieces after the newest step)."""

    def build(self, question: str, steps: Sequence[str]) -> ScoreQuery:
        if not steps:
            raise ValueError("a score query needs at least one step")
        stable, tail = self._pieces(question, [step.strip() for step in steps])
        ids = [token for piece in stable for token in self._encode(piece)]
        stable_len = len(ids)
        ids += [token for piece in tail for token in self._encode(piece)]
        return ScoreQuery(ids, (len(ids) - 1,), self.candidate_token_ids, stable_len)

    to_score = staticmethod(score_from_probs)


PRM_FORMATS: dict[str, type[PRMFormat]] = {}


def _register(cls: type[PRMFormat]) -> type[PRMFormat]:
    PRM_FORMATS[cls.name] = cls
    return cls


@_register
class RLHFlowFormat(PRMFormat):
    """RLHFlow PRMs (Llama3.1-8B-PRM-*): each step is a user turn and every past assistant
    reply is "+". The first user turn is question + " " + step 1, as RLHFlow's own scoring
    code and search-and-learn build it."""

    name = "rlhflow"
    sal_scores_empty_step = True

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.layout = chat_layout(tokenizer)
        if not self.layout.consistent_turns:
            raise ConfigError("rlhflow format: the chat template opens past and generated assistant "
                              "turns differently, so earlier steps could not be reused")
        self.candidate_token_ids = _candidates(tokenizer, "+", "-")

    def _pieces(self, question: str, steps: list[str]) -> tuple[list[str], list[str]]:
        layout = self.layout
        pieces = [layout.head + question, " " + steps[0]]
        for step in steps[1:]:
            pieces += [layout.user_to_assistant, "+" + layout.assistant_to_user, step]
        pieces.append(layout.user_to_assistant)
        return pieces, []


@_register
class MathShepherdFormat(PRMFormat):
    """Math-Shepherd as its model card lays it out: question + " " + steps, each followed by
    the step tag " ки" and separated by "\\n"; "+" vs "-" is read at the tag.

    The candidate ids are the first token of "+" and "-" and the tag id the last token of
    " ки", all read from the PRM's tokenizer (Mistral: 648, 387 and 12902, the ids the
    model card and search-and-learn hard-code). A SentencePiece tokenizer that starts every
    separately encoded piece with "▁" gives "▁+" and "▁ки", which is what such a model
    reads after a space."""

    name = "math-shepherd"
    step_tag = " ки"
    step_joiner = "\n"

    def __init__(self, tokenizer: Any, whole_string: bool = False) -> None:
        super().__init__(tokenizer)
        self.head = bos_text(tokenizer)
        self.candidate_token_ids = _candidates(tokenizer, "+", "-")
        self.tag_id = encode_text(tokenizer, self.step_tag)[-1]
        # search-and-learn's tokenization (`sal_whole_string`): the whole input as one string.
        self.whole_string = whole_string
        self.batch_tokenize = not whole_string

    def build(self, question: str, steps: Sequence[str]) -> ScoreQuery:
        """Piece by piece (prefix reuse), or as search-and-learn does: `tokenizer(text)` on the
        whole input, BOS added by the tokenizer, the score read at the last step tag. Pieces
        and whole string differ where the tokenizer marks every encode call's start (Mistral's
        SentencePiece "▁"); the whole string gives no prefix guarantee (stable length 0)."""
        if not self.whole_string:
            return super().build(question, steps)
        if not steps:
            raise ValueError("a score query needs at least one step")
        pieces, _ = self._pieces(question, [step.strip() for step in steps])
        ids = self.tokenizer.encode("".join(pieces)[len(self.head):], add_special_tokens=True)
        tags = [i for i, token in enumerate(ids) if token == self.tag_id]
        if not tags:
            raise ValueError(f"the Math-Shepherd input holds no step tag id {self.tag_id} when tokenized whole")
        return ScoreQuery(ids, (tags[-1],), self.candidate_token_ids, 0)

    def _prompt(self, question: str) -> str:
        return question

    def _pieces(self, question: str, steps: list[str]) -> tuple[list[str], list[str]]:
        pieces = [self.head + self._prompt(question), " " + steps[0], self.step_tag]
        for step in steps[1:]:
            pieces += [self.step_joiner + step, self.step_tag]
        return pieces, []


@_register
class MathShepherdSALFormat(MathShepherdFormat):
    """Math-Shepherd as search-and-learn feeds it: the generator's system prompt, "\\n",
    the question, "\\n", then " " + the steps with each step's "\\n\\n" turned into " ки\\n\\n"."""

    name = "math-shepherd-sal"
    step_joiner = "\n\n"

    def _prompt(self, question: str) -> str:
        return f"{SYSTEM_PROMPT}\n{question}\n"


# Qwen2.5-Math-PRM's step reward is softmax(head logits)[1] (its model card's
# `make_step_rewards`); listed good class first, as every format's candidates are.
REWARD_HEAD_CLASSES = (1, 0)


@_register
class QwenPRMFormat(PRMFormat):
    """Qwen2.5-Math-PRM: system + question in the chat template, then the assistant turn
    holds the steps, each followed by `<extra_0>`; the score is read at the separator.

    The model (Qwen2ForProcessRewardModel) has a two-class reward head instead of an LM
    head; the engine runs that head at the separator (tts_runtime/models/decoder.py) and
    the step reward is the softmax's class 1. With `good` and `bad` words the format reads
    those tokens' LM-head logits instead, for a checkpoint that expresses the verdict as
    tokens. Where `<extra_0>` is not a single token (any non-Qwen tokenizer), the separator
    is still written out as text and the score is read at its last token."""

    name = "qwen-prm"
    reads_reward_head = True
    sal_scores_empty_step = True
    separator = "<extra_0>"
    system_prompt = "Please reason step by step, and put your final answer within \\boxed{}."

    def __init__(self, tokenizer: Any, good: str | None = None, bad: str | None = None) -> None:
        super().__init__(tokenizer)
        self.layout = chat_layout(tokenizer, system=self.system_prompt)
        if good is None and bad is None:
            self.candidate_token_ids = REWARD_HEAD_CLASSES
        else:
            self.reads_reward_head = False
            self.candidate_token_ids = _candidates(tokenizer, good or "+", bad or "-")

    def _pieces(self, question: str, steps: list[str]) -> tuple[list[str], list[str]]:
        pieces = [self.layout.head + question + self.layout.user_to_assistant]
        for step in steps:
            pieces += [step, self.separator]
        return pieces, []


@_register
class JudgeFormat(PRMFormat):
    """Any chat LLM as a judge: asked whether the newest step is correct, P("Yes") vs "No"
    at the start of its reply. The instruction and question come first and the question
    about the last step comes after the steps, so only the new step and that short suffix
    are not shared with the previous call."""

    name = "judge"
    instruction = (
        "Below are a math problem and the first steps of a solution. Check only the most "
        "recent step: is it mathematically correct and consistent with the problem and the "
        "steps before it?\n\nProblem:\n"
    )
    steps_heading = "\n\nSolution so far:"
    ask = "\n\nIs the most recent step correct? Answer Yes or No."

    def __init__(self, tokenizer: Any) -> None:
        super().__init__(tokenizer)
        self.layout = chat_layout(tokenizer)
        self.candidate_token_ids = _candidates(tokenizer, "Yes", "No")

    def _pieces(self, question: str, steps: list[str]) -> tuple[list[str], list[str]]:
        stable = [self.layout.head + self.instruction + question + self.steps_heading]
        stable += ["\n\n" + step for step in steps]
        return stable, [self.ask + self.layout.user_to_assistant]


def prm_format_class(name: str) -> type[PRMFormat]:
    if name not in PRM_FORMATS:
        raise ConfigError(f"unknown PRM format '{name}'; choose one of {', '.join(sorted(PRM_FORMATS))}")
    return PRM_FORMATS[name]


def make_prm_format(name: str, tokenizer: Any, **options: Any) -> PRMFormat:
    return prm_format_class(name)(tokenizer, **options)


def check_prm_head(format_name: str, model: str, reward_head: bool) -> None:
    """One-line errors for a format and a PRM that do not fit: a reward head can only be
    read by the format made for it, and that format needs the head."""
    reads_head = prm_format_class(format_name).reads_reward_head
    if reward_head and not reads_head:
        raise ConfigError(f"PRM {model} has a reward head (Qwen2ForProcessRewardModel), which only the qwen-prm "
                          f"format reads, not {format_name}: pass --prm-format qwen-prm")
    if reads_head and not reward_head:
        raise ConfigError(f"PRM format {format_name} reads a Qwen2ForProcessRewardModel reward head; {model} has "
                          "an LM head: pass a Qwen2.5-Math-PRM folder as --prm, or another --prm-format")
