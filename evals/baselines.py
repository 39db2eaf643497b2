"""The plain way to run the same searches, for side-by-side comparison with the engine.

What search-and-learn does, minus vLLM: one problem at a time; each iteration the beams
of the problem go through one HF `generate` call (left-padded batch, stop at "\\n\\n", no
KV reuse across calls); each new step is scored by one HF forward that re-encodes the
beam's whole PRM input (the beams of a problem batched together, no prefix reuse, no score
cache). The search code itself is shared: this module only provides another
`StepBackend`, so both sides make exactly the same decisions from the same scores.

To be a fair baseline it is not made slower than it needs to be: the PRM forward asks HF
for last-position logits only (`logits_to_keep=1`), not the full vocabulary everywhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from search.beam_state import Beam, StepCounts, derive_seed
from search.config import STEP_DELIMITER, SearchConfig
from search.driver import solve
from search.prm import PRMFormat, ScoreQuery
from search.problem import Problem
from search.prompts import PromptBuilder
from search.results import ProblemResult
from search.session import build_prm_format, prm_format_name
from tts_runtime.config import ConfigError
from tts_runtime.models.loader import load_tokenizer, model_folder


@dataclass
class HFModels:
    """The generator and PRM as plain transformers models, over the engine's cached weights."""

    generator: torch.nn.Module
    generator_tokenizer: object
    prm: torch.nn.Module
    prm_tokenizer: object
    prm_name: str

    @classmethod
    def load(cls, generator: str, prm: str, dtype: torch.dtype = torch.float32) -> HFModels:
        from transformers import AutoModelForCausalLM

        def load(name: str):
            folder = model_folder(name)
            return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval(), load_tokenizer(folder)

        gen, gen_tok = load(generator)
        prm_model, prm_tok = load(prm)
        return cls(gen, gen_tok, prm_model, prm_tok, prm)

    @property
    def max_len(self) -> int:
        return self.generator.config.max_position_embeddings


class HFSteps:
    """`StepBackend` of one problem on HF transformers."""

    def __init__(self, models: HFModels, config: SearchConfig, prm_format: PRMFormat, problem: Problem) -> None:
        self.models = models
        self.config = config
        self.prm_format = prm_format
        self.problem = problem
        self.counts = StepCounts()
        if config.sal_empty_step and prm_format.sal_scores_empty_step:
            raise ConfigError("the HF baseline does not score search-and-learn's trailing empty step; "
                              "drop --sal-empty-step (or --sal-exact)")
        tokenizer = models.generator_tokenizer
        self._pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._stops = {tokenizer.eos_token_id, self._pad}

    def root(self) -> Beam:
        ids = PromptBuilder(self.models.generator_tokenizer).prompt_token_ids(self.problem.question)
        return Beam(ids, len(ids))

    async def expand(self, beams: list[Beam], iteration: int, *, width: int = 1,
                     to_eos: bool = False, greedy: bool = False) -> list[list[Beam]]:
        config, models = self.config, self.models
        input_ids, mask = _left_pad([beam.token_ids for beam in beams], self._pad)
        cap = config.max_tokens if to_eos else config.max_step_tokens
        max_new = min(cap, models.max_len - input_ids.shape[1])
        options: dict = {"max_new_tokens": max_new, "num_return_sequences": width, "pad_token_id": self._pad}
        if config.temperature > 0 and not greedy:
            options.update(do_sample=True, temperature=config.temperature, top_p=config.top_p, top_k=0)
        else:
            options.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if not to_eos:
            options.update(stop_strings=[STEP_DELIMITER], tokenizer=models.generator_tokenizer)
        torch.manual_seed(derive_seed(config.seed, self.problem.id, iteration))
        with torch.inference_mode():
            output = models.generator.generate(input_ids=input_ids, attention_mask=mask, **options)
        children: list[list[Beam]] = [[] for _ in beams]
        for row, generated in enumerate(output[:, input_ids.shape[1]:].tolist()):
            beam_index = row // width
            ids, text, reason = self._parse(generated, max_new, to_eos)
            self.counts.generated_tokens += len(ids)
            children[beam_index].append(beams[beam_index].child(
                ids, text, reason, max_len=models.max_len))
        return children

    def _parse(self, generated: list[int], max_new: int, to_eos: bool) -> tuple[list[int], str, str]:
        """(ids, text, finish reason) of one generated row; rows that stopped early are padded."""
        end = next((i for i, token in enumerate(generated) if token in self._stops), len(generated))
        ids = generated[:end]
        text = self.models.generator_tokenizer.decode(ids, skip_special_tokens=True)
        at = -1 if to_eos else text.find(STEP_DELIMITER)
        if at >= 0:
            return ids, text[: at + len(STEP_DELIMITER)], "stop"
        return ids, text, "length" if end == max_new else "eos"

    async def score(self, beams: list[Beam]) -> None:
        """Score each beam's unscored steps; every query is the whole sequence, re-encoded."""
        queries: list[ScoreQuery] = []
        owners: list[Beam] = []
        for beam in beams:
            for k in range(len(beam.step_scores), len(beam.steps)):
                queries.append(self.prm_format.build(self.problem.question, beam.steps[:k + 1]))
                owners.append(beam)
        for beam, score in zip(owners, self._forward(queries)):
            beam.step_scores = beam.step_scores + [score]

    def _forward(self, queries: list[ScoreQuery]) -> list[float]:
        if not queries:
            return []
        prm = self.models.prm
        pad = self.models.prm_tokenizer.pad_token_id or 0
        input_ids, mask = _left_pad([q.token_ids for q in queries], pad)
        positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
        with torch.inference_mode():
            logits = prm(input_ids=input_ids, attention_mask=mask, position_ids=positions, logits_to_keep=1).logits
        scores = []
        for query, row in zip(queries, logits[:, -1, :].float()):
            probs = row[list(query.candidate_token_ids)].softmax(dim=-1)
            scores.append(query.to_score(probs.tolist()))
            self.counts.prm_requests += 1
            self.counts.prm_tokens += len(query.token_ids)
        return scores


def _left_pad(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(len(row) for row in rows)
    ids = torch.full((len(rows), longest), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, longest - len(row):] = torch.tensor(row, dtype=torch.long)
        mask[i, longest - len(row):] = 1
    return ids, mask


def run_baseline(models: HFModels, problems: Sequence[Problem], config: SearchConfig, *,
                 on_result: Callable[[ProblemResult], None] | None = None) -> list[ProblemResult]:
    """The configured search on each problem in turn, the plain way."""
    prm_format = build_prm_format(config, prm_format_name(config, models.prm_name), models.prm_tokenizer)
    results = []
    for problem in problems:
        result = asyncio.run(solve(HFSteps(models, config, prm_format, problem), problem))
        if on_result is not None:
            on_result(result)
        results.append(result)
    return results
