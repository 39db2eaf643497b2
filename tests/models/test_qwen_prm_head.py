"""Qwen2.5-Math-PRM's two-class reward head (issue 11).

The test writes a tiny randomly initialised checkpoint in that model's layout: config.json
naming Qwen2ForProcessRewardModel, HF Qwen2Model weights under `model.`, the head
`score = Sequential(Linear(h, h), ReLU, Linear(h, 2))` under `score.`, and a ChatML
tokenizer with `<extra_0>` (SmolLM2's, whose chat template is Qwen's ChatML, plus the
separator as a special token). Our engine's step rewards are checked against the same
network computed directly in torch: transformers' Qwen2Model, then the head by hand,
softmax class 1 at each `<extra_0>`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from search.prm import REWARD_HEAD_CLASSES, check_prm_head, make_prm_format
from tts_runtime import Engine, EngineConfig, ScoreParams
from tts_runtime.config import ConfigError
from tts_runtime.models.loader import LoadedModel, load_model, load_tokenizer
from tts_runtime.runs.datasets import DatasetConfig, load_problems

SEPARATOR = "<extra_0>"
STEPS = ["We need $x^2 = 16$, so $x = \\pm 4$.", "The positive root is $4$.",
         "Check: $4^2 = 16$. The answer is $\\boxed{4}$."]


class TinyQwenPRM:
    """The checkpoint's network as transformers runs it, with the head applied by hand."""

    def __init__(self, folder: Path, tokenizer) -> None:
        from transformers import Qwen2Config, Qwen2Model

        config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=4096, tie_word_embeddings=False, initializer_range=0.2,
                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
        config.architectures = ["Qwen2ForProcessRewardModel"]
        torch.manual_seed(0)
        self.body = Qwen2Model(config).float().eval()
        self.head = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
        with torch.no_grad():  # wide enough that the two classes' probabilities spread out
            for param in self.head.parameters():
                param.normal_(0.0, 0.1)
        state = {f"model.{k}": v for k, v in self.body.state_dict().items()}
        state.update({f"score.{k}": v for k, v in self.head.state_dict().items()})
        save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(config.to_dict(), indent=2))
        tokenizer.save_pretrained(folder)

    @torch.no_grad()
    def step_rewards(self, ids: list[int], positions: list[int]) -> torch.Tensor:
        hidden = self.body(input_ids=torch.tensor([ids])).last_hidden_state[0]
        return self.head(hidden).softmax(dim=-1)[positions, 1]


@pytest.fixture(scope="module")
def tiny_prm(tmp_path_factory, generator_model: LoadedModel) -> tuple[TinyQwenPRM, LoadedModel]:
    folder = tmp_path_factory.mktemp("prm") / "qwen2.5-math-prm-tiny"
    folder.mkdir()
    tokenizer = load_tokenizer(generator_model.folder)
    tokenizer.add_tokens([SEPARATOR], special_tokens=True)
    reference = TinyQwenPRM(folder, tokenizer)
    return reference, load_model(str(folder), torch.float32, torch.device("cpu"))


@pytest.fixture(scope="module")
def question(math500_path: Path) -> str:
    return load_problems(DatasetConfig(dataset_path=str(math500_path), limit=1))[0].question


def test_checkpoint_loads_the_reward_head(tiny_prm):
    reference, loaded = tiny_prm
    assert loaded.arch.reward_labels == 2 and loaded.model.lm_head is None
    torch.testing.assert_close(loaded.model.score[2].weight, reference.head[2].weight, rtol=0, atol=0)


def test_scores_match_torch_one_per_step_at_each_separator(tiny_prm, question):
    reference, loaded = tiny_prm
    fmt = make_prm_format("qwen-prm", loaded.tokenizer)
    assert fmt.candidate_token_ids == REWARD_HEAD_CLASSES == (1, 0)
    query = fmt.build(question, STEPS)
    separator = loaded.tokenizer.convert_tokens_to_ids(SEPARATOR)
    at_separators = [i for i, token in enumerate(query.token_ids) if token == separator]
    assert len(at_separators) == len(STEPS) and at_separators[-1] == query.positions[0]

    engine = Engine(loaded.name, EngineConfig(), loaded=loaded)
    out = engine.score([query.token_ids], ScoreParams(at_separators, query.candidate_token_ids))[0]
    ours = torch.tensor([query.to_score(row) for row in out.scores], dtype=torch.float32)
    expected = reference.step_rewards(query.token_ids, at_separators)
    assert len(out.scores) == len(STEPS)
    torch.testing.assert_close(ours, expected, rtol=0, atol=1e-5)
    assert expected.max() - expected.min() > 0.05  # the comparison is not between constants

    # As a search sends them: one query per step, its score at its own last separator,
    # the steps before it served from the prefix cache.
    for k in range(1, len(STEPS) + 1):
        step_query = fmt.build(question, STEPS[:k])
        assert step_query.token_ids == query.token_ids[:at_separators[k - 1] + 1]
        row = engine.score([step_query.token_ids], step_query.score_params())[0].scores
        assert len(row) == 1
        assert abs(step_query.to_score(row[0]) - expected[k - 1].item()) <= 1e-5


def test_format_and_head_must_fit(tiny_prm):
    _, loaded = tiny_prm
    check_prm_head("qwen-prm", loaded.name, reward_head=True)
    with pytest.raises(ConfigError, match="only the qwen-prm format reads"):
        check_prm_head("judge", loaded.name, reward_head=True)
    with pytest.raises(ConfigError, match="has an LM head"):
        check_prm_head("qwen-prm", "gemma3-270m", reward_head=False)


def test_beam_search_scores_steps_with_the_head(tiny_prm, generator_model, math500_path, tmp_path):
    """A real search on the reward-head PRM (its folder name picks qwen-prm): every kept step
    score is a class-1 probability, and a format that reads tokens is refused up front."""
    from dataclasses import replace

    from tts_runtime.runs.run_folder import RunFolder
    from tts_runtime.runs.run import run_into_folder
    from memory.split import MemoryConfig
    from search.config import SearchConfig
    from tts_runtime.cohost.runtime import Runtime

    _, loaded = tiny_prm
    problems = load_problems(DatasetConfig(dataset_path=str(math500_path), levels=(1,), limit=1))
    config = SearchConfig(method="beam", n=2, beam_width=2, num_iterations=2, max_step_tokens=16, max_tokens=48,
                          temperature=0.0, problem_batch=1)
    runtime = Runtime(generator_model, loaded, memory=MemoryConfig(device_memory=2 << 30))
    try:
        with pytest.raises(ConfigError, match="only the qwen-prm format reads"):
            run_into_folder(runtime, problems, replace(config, prm_format="judge"),
                            RunFolder.open(tmp_path / "judge", resume=False))
        outcome = run_into_folder(runtime, problems, config, RunFolder.open(tmp_path / "run", resume=False))
    finally:
        runtime.shutdown()
    [result] = outcome.new
    scores = [score for beam in result.beams for score in beam.step_scores]
    assert scores and all(0.0 < score < 1.0 for score in scores)
    assert outcome.metrics["failed"]["count"] == 0


def test_other_heads_are_a_one_line_error(tiny_prm, tmp_path):
    _, loaded = tiny_prm
    folder = tmp_path / "classifier"
    shutil.copytree(loaded.folder, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen2ForSequenceClassification"]}))
    with pytest.raises(ConfigError) as error:
        load_model(str(folder), torch.float32, torch.device("cpu"))
    assert "unsupported architecture 'Qwen2ForSequenceClassification'" in str(error.value)
    assert "\n" not in str(error.value)
