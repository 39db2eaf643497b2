"""The vLLM side of the benchmarks: `tts bench engine --backend vllm` and
`tts bench search --backend vllm` add these variants to the same alternating runs.

* engine: the generator and the PRM on `VllmEngine` (same prompts, queries and dtype as
  the native engine and HF in the same run);
* search: tts's search on a vLLM runtime, and the configuration a user would otherwise
  run: search-and-learn's algorithm with its generator on vLLM and its PRM on HF
  re-encoding every sequence (one problem at a time, as the plain HF baseline).

vLLM's own settings (eager, block size, KV bytes) are described in docs/vllm.md.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import torch

from evals.baselines import HFModels, HFSteps
from search.beam_state import Beam, derive_seed
from search.config import STEP_DELIMITER, SearchConfig
from search.driver import solve
from search.prm import make_prm_format
from search.problem import Problem
from search.results import ProblemResult
from search.session import prm_format_name
from tts_runtime.cohost.vllm_engine import VllmEngine
from tts_runtime.config import EngineConfig, ModelSpec
from tts_runtime.engine.request import SamplingParams
from tts_runtime.models.loader import LoadedModel


def vllm_engine(loaded: LoadedModel, dtype: torch.dtype, tokens: int) -> VllmEngine:
    """A vLLM engine whose KV cache holds `tokens` tokens and a quarter more (no
    preemption, and no more memory than the workload needs on a shared machine)."""
    per_token = loaded.arch.kv_bytes_per_token(torch.tensor([], dtype=dtype).element_size())
    return VllmEngine(ModelSpec(loaded.name, str(dtype).removeprefix("torch.")), EngineConfig(), loaded=loaded,
                      kv_cache_bytes=int(tokens * 1.25) * per_token)


def generate_variant(loaded: LoadedModel, dtype: torch.dtype, prompts: list[list[int]],
                     new_tokens: int) -> Callable[[], dict]:
    """The engine benchmark's generate workload on vLLM (T=0.8, ignore EOS)."""
    engine = vllm_engine(loaded, dtype, sum(len(p) + new_tokens for p in prompts))
    params = SamplingParams(temperature=0.8, max_tokens=new_tokens, ignore_eos=True)
    engine.generate(prompts[:4], SamplingParams(temperature=0.8, max_tokens=4))  # warm-up, as for tts

    def run() -> dict:
        outputs = engine.generate(prompts, params)
        return {"tokens": sum(len(o.completions[0].token_ids) for o in outputs)}
    return run


def score_variant(loaded: LoadedModel, dtype: torch.dtype, queries: list[list[Any]]) -> Callable[[], dict]:
    """The engine benchmark's score workload on vLLM, iteration by iteration; each run
    starts from an empty prefix cache, as tts's runs start from a new engine."""
    engine = vllm_engine(loaded, dtype, sum(len(q.token_ids) for q in queries[-1]))

    def run() -> dict:
        engine.reset_prefix_cache()
        before = engine.stats.computed_tokens
        for per_iteration in queries:
            engine.score([q.token_ids for q in per_iteration], [q.score_params() for q in per_iteration])
        return {"computed_tokens": engine.stats.computed_tokens - before}
    return run


def engine_rows(label: str, generate_rates: dict[str, float], score_seconds: dict[str, float],
                score_tokens: dict[str, float]) -> list[dict]:
    """Rows beside the HF ones: tts against vLLM on the same workloads."""
    return [
        {"workload": f"generate on vLLM, {label}", "hf": f"{generate_rates['vllm']:.1f} tok/s (vLLM)",
         "tts": f"{generate_rates['tts']:.1f} tok/s", "ratio": f"{generate_rates['tts'] / generate_rates['vllm']:.2f}x",
         "target": "(tts / vLLM)"},
        {"workload": f"score wall time on vLLM (prefix caching), {label}",
         "hf": f"{score_seconds['vllm']:.2f} s (vLLM)", "tts": f"{score_seconds['tts']:.2f} s",
         "ratio": f"{score_seconds['vllm'] / score_seconds['tts']:.2f}x less", "target": "(vLLM / tts)"},
        {"workload": f"score computed tokens on vLLM, {label}", "hf": f"{score_tokens['vllm']:.0f} (vLLM)",
         "tts": f"{score_tokens['tts']:.0f}", "ratio": f"{score_tokens['vllm'] / score_tokens['tts']:.2f}x fewer",
         "target": "(vLLM / tts)"},
    ]


class VllmGeneratorSteps(HFSteps):
    """search-and-learn's configuration: each iteration the problem's beams go to vLLM in
    one call (its prefix cache on, as search-and-learn turns it on); every new step is
    scored by the HF PRM re-encoding the whole sequence (HFSteps.score)."""

    def __init__(self, engine: VllmEngine, models: HFModels, config: SearchConfig, problem: Problem) -> None:
        super().__init__(models, config, make_prm_format(prm_format_name(config, models.prm_name),
                                                          models.prm_tokenizer), problem)
        self.engine = engine

    async def expand(self, beams: list[Beam], iteration: int, *, width: int = 1,
                     to_eos: bool = False) -> list[list[Beam]]:
        config, max_len = self.config, self.engine.max_model_len
        cap = config.max_tokens if to_eos else config.max_step_tokens
        params = [SamplingParams(temperature=config.temperature, top_p=config.top_p, n=width,
                                 seed=derive_seed(config.seed, self.problem.id, iteration, index),
                                 max_tokens=max(1, min(cap, max_len - len(beam.token_ids) - 1)),
                                 stop=() if to_eos else (STEP_DELIMITER,), include_stop_str_in_output=True)
                  for index, beam in enumerate(beams)]
        outputs = self.engine.generate([beam.token_ids for beam in beams], params)
        children: list[list[Beam]] = []
        for beam, output in zip(beams, outputs):
            children.append([beam.child(c.token_ids, c.text, c.finish_reason, max_len=max_len)
                             for c in output.completions])
            self.counts.generated_tokens += sum(len(c.token_ids) for c in output.completions)
        return children


def run_sal_vllm(engine: VllmEngine, models: HFModels, problems: Sequence[Problem],
                 config: SearchConfig) -> list[ProblemResult]:
    """search-and-learn's beam search, generator on vLLM, PRM on HF: problem by problem."""
    return [asyncio.run(solve(VllmGeneratorSteps(engine, models, config, problem), problem)) for problem in problems]
