"""The engine-backed step backend: one problem's generate and score requests, sent
through the runtime so that they share the engines' batches with other problems'.

Requests are submitted synchronously (`runtime.submit_*`) and only then awaited: a search
woken by the runtime enqueues its next requests within one or two event-loop turns, before
the runtime's next engine step, so concurrent problems land in the same batch.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from collections.abc import Sequence
from typing import Any

from search.beam_state import Beam, StepCounts, step_seed
from search.config import STEP_DELIMITER, SearchConfig
from search.prm import MathShepherdFormat, PRMFormat, ScoreQuery, make_prm_format, prm_format_class
from search.prm_detect import detect_prm_format
from search.prm_fit import check_prm_fit
from search.problem import Problem
from search.prompts import PromptBuilder
from search.score_cache import ScoreCache
from search.speculation import Speculation, Speculator
from tts_runtime.cohost.runtime import Runtime
from tts_runtime.config import ConfigError
from tts_runtime.engine.request import RequestOutput, SamplingParams

Prefix = tuple[str, ...]


def prm_format_name(config: SearchConfig, prm_model: str) -> str:
    """The configured PRM format, else the one the PRM was trained with."""
    return config.prm_format or detect_prm_format(prm_model)


def build_prm_format(config: SearchConfig, format_name: str, tokenizer: Any) -> PRMFormat:
    """The PRM format, tokenizing Math-Shepherd inputs whole under `sal_whole_string`."""
    math_shepherd = issubclass(prm_format_class(format_name), MathShepherdFormat)
    options = {"whole_string": True} if config.sal_whole_string and math_shepherd else {}
    return make_prm_format(format_name, tokenizer, **options)


class SearchSession:
    """What every problem of a run shares: the runtime, prompts, PRM format and score cache."""

    def __init__(self, runtime: Runtime, config: SearchConfig, cache: ScoreCache | None = None) -> None:
        if runtime.generator.tokenizer is None or runtime.prm.tokenizer is None:
            raise ConfigError("search needs models with tokenizers; dummy weights have none")
        config = config.resolved()
        self.runtime = runtime
        self.config = config
        self.cache = cache if cache is not None else ScoreCache()
        self.prompts = PromptBuilder.configured(runtime.generator.tokenizer, config.system_prompt,
                                              config.chat_template)
        self.format_name = prm_format_name(config, runtime.prm.spec.model)
        check_prm_fit(self.format_name, runtime.prm.spec.model, runtime.prm.tokenizer)
        self.prm_format: PRMFormat = build_prm_format(config, self.format_name, runtime.prm.tokenizer)
        # search-and-learn's trailing empty step (`sal_empty_step`), where its input has one.
        self.empty_step = bool(config.sal_empty_step) and self.prm_format.sal_scores_empty_step
        # Scores depend on the PRM and on how its input is laid out.
        whole = getattr(self.prm_format, "whole_string", False)
        self.prm_key = f"{runtime.prm.spec.model}:{self.format_name}" + (":whole-string" if whole else "")
        if config.speculative_extension and config.sal_retokenize:
            raise ConfigError("speculative extension continues beams from their sampled tokens, which "
                              "sal_retokenize replaces; drop --speculative-extension or pass --no-sal-retokenize")
        if config.speculative_extension and runtime.backend != "native":
            raise ConfigError("speculative extension needs the native engine (it aborts requests and numbers "
                              "child seeds); drop --speculative-extension or use --backend native")

    def steps_for(self, problem: Problem) -> EngineSteps:
        return EngineSteps(self, problem)


class EngineSteps:
    """The `StepBackend` of one problem on our engines."""

    def __init__(self, session: SearchSession, problem: Problem) -> None:
        self.session = session
        self.problem = problem
        self.config: SearchConfig = session.config
        self.counts = StepCounts()
        self._max_len = session.runtime.generator.max_model_len
        self.speculator: Speculator | None = None
        if self.config.speculative_extension:
            self.speculator = Speculator(session.runtime, self.config, self.counts,
                                         lambda beam, iteration, to_eos: self._params(beam, iteration, 1, to_eos))

    def root(self) -> Beam:
        ids = self.session.prompts.prompt_token_ids(self.problem.question)
        return Beam(ids, len(ids))

    # -- generation ------------------------------------------------------------------
    async def expand(self, beams: list[Beam], iteration: int, *, width: int = 1,
                     to_eos: bool = False, greedy: bool = False) -> list[list[Beam]]:
        if self.config.sal_retokenize:
            beams = [self._retokenized(beam) for beam in beams]
        # Identical beams (refill copies) become one request with n children: the engine
        # prefills their shared ids once and forks.
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, beam in enumerate(beams):
            groups.setdefault(tuple(beam.token_ids), []).append(index)
        if self.speculator is not None:
            return await self._expand_speculating(beams, groups, iteration, to_eos)
        runtime = self.session.runtime
        futures = [
            runtime.submit_generate(beams[members[0]].token_ids,
                                    self._params(beams[members[0]], iteration, len(members) * width, to_eos,
                                                 greedy=greedy))
            for members in groups.values()
        ]
        outputs: list[RequestOutput] = await asyncio.gather(*futures)
        children: list[list[Beam]] = [[] for _ in beams]
        for members, output in zip(groups.values(), outputs):
            for slot, index in enumerate(members):
                for completion in output.completions[slot * width:(slot + 1) * width]:
                    self.counts.generated_tokens += len(completion.token_ids)
                    children[index].append(beams[index].child(
                        completion.token_ids, completion.text, completion.finish_reason,
                        max_len=self._max_len))
        return children

    def _retokenized(self, beam: Beam) -> Beam:
        """The beam with search-and-learn's generator input (`sal_retokenize`): its text
        rendered into the prompt and encoded as one string."""
        if not beam.steps:
            return beam
        ids = self.session.prompts.continuation_token_ids(self.problem.question, beam.text)
        return replace(beam, token_ids=ids)

    async def _expand_speculating(self, beams: list[Beam], groups: dict[tuple[int, ...], list[int]],
                                  iteration: int, to_eos: bool) -> list[list[Beam]]:
        """Beam search with speculative extension: one request per beam (child seeds numbered
        as in the group's shared request, so the tokens are the same), so that each beam's
        finished step is seen at once and starts its speculative next step. The first copy
        of a survivor takes that survivor's speculation instead of a request."""
        speculator, runtime = self.speculator, self.session.runtime
        speculator.begin(iteration)
        jobs = []
        for members in groups.values():
            beam = beams[members[0]]
            speculation = speculator.take(beam)
            for slot in range(len(members)):
                if slot == 0 and speculation is not None:
                    jobs.append(self._speculated_step(beam, iteration, to_eos, speculation))
                else:
                    future = runtime.submit_generate(beam.token_ids,
                                                     self._params(beam, iteration, 1, to_eos, slot))
                    jobs.append(self._step(beam, future))
        speculator.drop_untaken()
        done = await asyncio.gather(*jobs)
        slots = iter(done)
        children: list[list[Beam]] = [[] for _ in beams]
        for members in groups.values():
            for index in members:
                children[index].append(next(slots))
        return children

    async def _step(self, beam: Beam, future: asyncio.Future) -> Beam:
        return self._child(beam, await future)

    async def _speculated_step(self, beam: Beam, iteration: int, to_eos: bool, speculation: Speculation) -> Beam:
        output = await self.speculator.result(speculation)
        if output is None:  # cut short by the speculation cap: generate the step anew
            output = await self.session.runtime.submit_generate(beam.token_ids,
                                                                self._params(beam, iteration, 1, to_eos))
        return self._child(beam, output)

    def _child(self, beam: Beam, output: RequestOutput) -> Beam:
        """The beam plus its finished step, which at once starts the step after it."""
        completion = output.completions[0]
        self.counts.generated_tokens += len(completion.token_ids)
        child = beam.child(completion.token_ids, completion.text, completion.finish_reason, max_len=self._max_len)
        self.speculator.start(child)
        return child

    def _params(self, beam: Beam, iteration: int, n: int, to_eos: bool, first_child: int = 0,
                greedy: bool = False) -> SamplingParams:
        config = self.config
        cap = config.max_tokens if to_eos else config.max_step_tokens
        return SamplingParams(
            temperature=0.0 if greedy else config.temperature, top_p=config.top_p, n=n, first_child=first_child,
            seed=step_seed(config.seed, self.problem.id, iteration, beam),
            max_tokens=min(cap, self._max_len - len(beam.token_ids)),
            stop=() if to_eos else (STEP_DELIMITER,), include_stop_str_in_output=True)

    def close(self) -> None:
        """The search is over (or stopped): nothing of it may keep generating."""
        if self.speculator is not None:
            self.speculator.close()

    # -- scoring ---------------------------------------------------------------------
    async def score(self, beams: list[Beam]) -> None:
        """Every step of every beam is scored, as search-and-learn does each iteration; the
        cache answers all but the step prefixes never seen before."""
        scored = [self._scored_prefixes(beam) for beam in beams]
        scores = iter(await self._score_prefixes([prefix for prefixes in scored for prefix in prefixes]))
        for beam, prefixes in zip(beams, scored):
            beam.step_scores = [next(scores) for _ in prefixes]

    def _scored_prefixes(self, beam: Beam) -> list[Prefix]:
        """Every step prefix of the beam; under `sal_empty_step`, a text ending in the step
        delimiter adds the prefix with an empty step after it, as search-and-learn's
        `text.split("\n\n")` does."""
        prefixes = [tuple(beam.steps[:k]) for k in range(1, len(beam.steps) + 1)]
        if self.session.empty_step and beam.text.endswith(STEP_DELIMITER):
            prefixes.append((*beam.steps, ""))
        return prefixes

    async def _score_prefixes(self, prefixes: Sequence[Prefix]) -> list[float]:
        session = self.session
        cache, key, pid = session.cache, session.prm_key, self.problem.id
        known: dict[Prefix, float] = {}
        missing: list[Prefix] = []
        for prefix in dict.fromkeys(prefixes):
            score = cache.get(key, pid, prefix)
            if score is None:
                missing.append(prefix)
            else:
                known[prefix] = score
        for wave in _waves(missing):
            queries = session.prm_format.build_many(self.problem.question, [list(prefix) for prefix in wave])
            outputs = await asyncio.gather(*(
                session.runtime.submit_score(query.token_ids, query.score_params()) for query in queries))
            for prefix, query, output in zip(wave, queries, outputs):
                known[prefix] = self._record(prefix, query, output)
        # A prefix repeated in this call (identical beams) is looked up again now that its
        # score is stored: a cache hit, never a second PRM request.
        seen: set[Prefix] = set()
        scores = []
        for prefix in prefixes:
            scores.append(cache.get(key, pid, prefix) if prefix in seen else known[prefix])
            seen.add(prefix)
        return scores

    def _record(self, prefix: Prefix, query: ScoreQuery, output: RequestOutput) -> float:
        score = query.to_score(output.scores[0])
        self.session.cache.put(self.session.prm_key, self.problem.id, prefix, score)
        self.counts.prm_requests += 1
        self.counts.prm_tokens += len(query.token_ids)
        self.counts.prm_cached_tokens += output.num_cached_prompt_tokens
        return score


def _waves(missing: list[Prefix]) -> list[list[Prefix]]:
    """Order misses so that a prefix goes to the PRM only after its parent prefix (when that
    is also a miss) was computed: the child's query then reuses the parent's KV blocks
    instead of both being prefilled side by side."""
    wave_of: dict[Prefix, int] = {}
    waves: list[list[Prefix]] = []
    for prefix in sorted(missing, key=len):
        wave = wave_of[prefix[:-1]] + 1 if prefix[:-1] in wave_of else 0
        wave_of[prefix] = wave
        if wave == len(waves):
            waves.append([])
        waves[wave].append(prefix)
    return waves
