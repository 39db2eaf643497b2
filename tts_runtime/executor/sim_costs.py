"""How long a simulated forward takes: fixed + per decode row + per prefill token + per token
of context attended to, one set of coefficients for the model that samples (the generator) and
one for the model that scores (the PRM).

The defaults are the H100 run's own fits (docs/benchmarks/cohost_gpu.json,
summary.alternate_forward_costs: SmolLM2-135M generator, Gemma-3-270M PRM, bf16). Those fits
time a forward from launch to result on the host, so they include the executor's Python
kernel launches (318 for a PRM forward of 1.6 ms device time, docs/benchmarks/gpu_profile.md):
the simulated device is as slow as that executor, not as the bare GPU. The generator's
per-prefill-token cost (0.36 ms) is a fitting artefact rather than arithmetic: decode-only
forwards replay CUDA graphs, forwards with a prefill chunk run eagerly (~13 ms of launches,
like the PRM's fixed cost), and the linear fit has no term for "has a prefill", so it loads
that onto the few prefill tokens such forwards carry (~40 per step). Pass `sim:FILE` with
`prefill_fixed_seconds` to model it as a fixed cost instead.

The simulated device has the H100's memory (NVML's total for the 80 GB card) unless the file
gives `device_memory`: its KV is a block manager's count, not memory, but a budget beyond any
card is a typo, and one of terabytes would have the block managers list billions of blocks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

from tts_runtime.executor.batch import ModelInput

H100_MEMORY = 85_520_809_984


@dataclass(frozen=True)
class SimCost:
    fixed_seconds: float = 0.0
    seconds_per_decode: float = 0.0
    seconds_per_prefill_token: float = 0.0
    seconds_per_context_token: float = 0.0  # every token a forward attends to (cached prefix included)
    prefill_fixed_seconds: float = 0.0  # extra for a forward with any prefill (no CUDA graph)

    @classmethod
    def of(cls, data: dict) -> SimCost:
        """From a fit's fields; unknown fields are ignored (a fit may carry more than a cost)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in data.items() if k in names})

    def seconds(self, batch: ModelInput) -> float:
        meta = batch.meta
        prefill_tokens = sum(meta.prefill_query_lens)
        seconds = (self.fixed_seconds + (self.prefill_fixed_seconds if prefill_tokens else 0.0)
                   + meta.num_decodes * self.seconds_per_decode + prefill_tokens * self.seconds_per_prefill_token)
        if self.seconds_per_context_token:  # a tensor sum per forward: not for the defaults, which have no such term
            context = sum(meta.prefill_context_lens)
            if meta.num_decodes:
                context += int(meta.decode_context_lens.sum())
            seconds += context * self.seconds_per_context_token
        return seconds


@dataclass(frozen=True)
class SimCosts:
    """One cost per role: a forward that samples is the generator's, one that only scores the PRM's."""

    generator: SimCost = SimCost(1.2548734663061743e-3, 5.0351309669202085e-5, 3.60639435108232e-4)
    prm: SimCost = SimCost(1.3495509645995857e-2, 0.0, 1.7214543046525718e-6)
    device_memory: int = H100_MEMORY

    def seconds(self, batch: ModelInput) -> float:
        scores_only = bool(batch.score_rows) and batch.sample_rows.numel() == 0
        return (self.prm if scores_only else self.generator).seconds(batch)

    @classmethod
    def from_file(cls, path: Path) -> SimCosts:
        """A fit JSON: {"generator": {...}, "prm": {...}, optionally "device_memory": bytes}, or
        a report holding one under summary.alternate_forward_costs (what `tts bench cohost`
        writes on a real device)."""
        data = json.loads(Path(path).read_text())
        summary = data.get("summary") if isinstance(data, dict) else None
        if isinstance(summary, dict) and "alternate_forward_costs" in summary:
            data = summary["alternate_forward_costs"]
        if not (isinstance(data, dict) and isinstance(data.get("generator"), dict) and isinstance(data.get("prm"), dict)):
            raise ValueError(f"{path}: a sim cost file needs 'generator' and 'prm' fits")
        return cls(SimCost.of(data["generator"]), SimCost.of(data["prm"]),
                   int(data.get("device_memory", H100_MEMORY)))
