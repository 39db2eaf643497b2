"""Runtime: co-hosts the generator and the PRM on one device and one memory budget.

Callers enqueue generate/score requests and get asyncio futures (or use the blocking
helpers). One driver steps both engines in turn while any future is pending, so requests
from every in-flight search share the engines' batches.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass

from memory.split import MemoryConfig, MemoryPlan, plan_memory
from tts_runtime.config import EngineConfig, ModelSpec, resolve_device, resolve_dtype
from tts_runtime.engine.engine import Engine
from tts_runtime.engine.request import RequestOutput, SamplingParams, ScoreParams
from tts_runtime.models.loader import load_model


@dataclass
class RuntimeStats:
    generator: dict
    prm: dict


class Runtime:
    def __init__(self, generator: ModelSpec | str, prm: ModelSpec | str,
                 memory: MemoryConfig | None = None, engine_config: EngineConfig | None = None) -> None:
        self.engine_config = engine_config or EngineConfig()
        self.memory = memory or MemoryConfig()
        gen_spec = ModelSpec(generator) if isinstance(generator, str) else generator
        prm_spec = ModelSpec(prm) if isinstance(prm, str) else prm
        device = resolve_device(self.engine_config.device)
        gen_loaded = load_model(gen_spec.model, resolve_dtype(gen_spec.dtype, device), device)
        prm_loaded = load_model(prm_spec.model, resolve_dtype(prm_spec.dtype, device), device)
        self.plan: MemoryPlan = plan_memory(self.memory, gen_loaded, prm_loaded, self.engine_config, device)
        self.generator = Engine(gen_spec, self.engine_config, loaded=gen_loaded,
                                num_blocks=self.plan.generator_blocks)
        self.prm = Engine(prm_spec, self.engine_config, loaded=prm_loaded, num_blocks=self.plan.prm_blocks)
        self._pending: dict[tuple[str, str], asyncio.Future | list] = {}
        self._ids = itertools.count()

    # -- async API -------------------------------------------------------------------
    def submit_generate(self, prompt: list[int], params: SamplingParams) -> asyncio.Future:
        return self._submit(self.generator, "g", prompt, params)

    def submit_score(self, prompt: list[int], params: ScoreParams) -> asyncio.Future:
        return self._submit(self.prm, "p", prompt, params)

    def _submit(self, engine: Engine, kind: str, prompt: list[int],
                params: SamplingParams | ScoreParams) -> asyncio.Future:
        request_id = f"{kind}{next(self._ids)}"
        engine.add_request(request_id, prompt, params)
        future = asyncio.get_running_loop().create_future()
        self._pending[(kind, request_id)] = future
        return future

    async def generate(self, prompt: list[int], params: SamplingParams) -> RequestOutput:
        return await self.submit_generate(prompt, params)

    async def score(self, prompt: list[int], params: ScoreParams) -> RequestOutput:
        return await self.submit_score(prompt, params)

    def step(self) -> int:
        """One step of each engine that has work; resolves finished futures."""
        resolved = 0
        for kind, engine in (("g", self.generator), ("p", self.prm)):
            if not engine.has_unfinished_requests():
                continue
            for output in engine.step():
                future = self._pending.pop((kind, output.request_id))
                if not future.cancelled():
                    future.set_result(output)
                resolved += 1
        return resolved

    @property
    def busy(self) -> bool:
        return self.generator.has_unfinished_requests() or self.prm.has_unfinished_requests()

    async def drive(self, until: asyncio.Future | asyncio.Task) -> None:
        """Step the engines whenever every coroutine is waiting on them, until `until` is done."""
        while not until.done():
            # Let every woken coroutine enqueue its next requests before the next step.
            for _ in range(3):
                await asyncio.sleep(0)
            if until.done():
                break
            if self.busy:
                self.step()
            else:
                await asyncio.sleep(0)

    def stats(self) -> RuntimeStats:
        return RuntimeStats(self.generator.stats.as_dict(), self.prm.stats.as_dict())

    def shutdown(self) -> None:
        self.generator.shutdown()
        self.prm.shutdown()
