"""Whole-batch calls over an engine's step-level API, shared by every engine type."""

from __future__ import annotations

import itertools

from tts_runtime.engine.request import RequestOutput, SamplingParams, ScoreParams


class BlockingCalls:
    """`generate`, `score` and `run_until_done` for a class that has `add_request`, `step`
    and `has_unfinished_requests`."""

    def run_until_done(self) -> list[RequestOutput]:
        outputs = []
        while self.has_unfinished_requests():
            outputs.extend(self.step())
        return outputs

    def generate(self, prompts: list[str | list[int]],
                 params: SamplingParams | list[SamplingParams]) -> list[RequestOutput]:
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        return self._run_batch(prompts, per_prompt)

    def score(self, prompts: list[str | list[int]], params: ScoreParams | list[ScoreParams]) -> list[RequestOutput]:
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        return self._run_batch(prompts, per_prompt)

    def _run_batch(self, prompts: list, params: list) -> list[RequestOutput]:
        batch = next(self.__dict__.setdefault("_batch_ids", itertools.count()))
        base = f"batch{batch}-"
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            self.add_request(f"{base}{i}", prompt, p)
        results = {o.request_id: o for o in self.run_until_done()}
        return [results[f"{base}{i}"] for i in range(len(prompts))]
