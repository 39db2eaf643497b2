"""Turns next-token logits into tokens, one row per sequence, with per-row parameters.

Sampling inverts the CDF with one uniform number per row (filling a whole vocabulary row
with noise costs more than the forward of a small model on a CPU); a seeded request draws
its number from its own generator, so its tokens do not depend on what else shares the
batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tts_runtime.engine.request import SamplingParams


@dataclass
class SamplingRow:
    params: SamplingParams
    token_ids: list[int]  # prompt + output so far (repetition penalty reads both)
    num_prompt_tokens: int
    generator: torch.Generator | None


def child_generator(seed: int | None, child_index: int, device: torch.device) -> torch.Generator | None:
    """Each child of a seeded request gets its own reproducible stream."""
    if seed is None:
        return None
    generator = torch.Generator(device=device)
    generator.manual_seed(hash((seed, child_index)) & 0x7FFF_FFFF_FFFF_FFFF)
    return generator


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    for i, row in enumerate(rows):
        p = row.params
        if not p.uses_penalties:
            continue
        if p.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(row.token_ids)), device=logits.device, dtype=torch.long)
            values = logits[i, seen]
            logits[i, seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        output = row.token_ids[row.num_prompt_tokens:]
        if output and (p.frequency_penalty or p.presence_penalty):
            ids = torch.tensor(output, device=logits.device, dtype=torch.long)
            counts = torch.bincount(ids, minlength=logits.shape[1]).to(logits.dtype)
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def _filter(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p; returns probabilities."""
    device = logits.device
    temps = torch.tensor([r.params.temperature for r in rows], device=device).unsqueeze(1)
    logits = logits / temps
    top_k = [r.params.top_k for r in rows]
    top_p = [r.params.top_p for r in rows]
    if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        vocab = logits.shape[1]
        ks = torch.tensor([k if k > 0 else vocab for k in top_k], device=device).unsqueeze(1)
        ranks = torch.arange(vocab, device=device).unsqueeze(0)
        drop = ranks >= ks
        probs_sorted = sorted_logits.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the token crossing it stays).
        mass_before = probs_sorted.cumsum(dim=-1) - probs_sorted
        drop |= mass_before >= torch.tensor(top_p, device=device).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    min_p = [r.params.min_p for r in rows]
    if any(m > 0 for m in min_p):
        threshold = torch.tensor(min_p, device=device).unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


def sample(logits: torch.Tensor, rows: list[SamplingRow], generator: torch.Generator | None) -> list[int]:
    """logits [len(rows), vocab] -> one token id per row."""
    logits = logits.float()
    _apply_penalties(logits, rows)
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    out = [0] * len(rows)
    if greedy:
        picks = logits[greedy].argmax(dim=-1).tolist()
        for i, t in zip(greedy, picks):
            out[i] = t
    random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
    if not random_rows:
        return out
    sub_rows = [rows[i] for i in random_rows]
    probs = _filter(logits[random_rows], sub_rows)
    picks = _inverse_cdf(probs, _uniforms(sub_rows, generator, probs.device)).tolist()
    for i, t in zip(random_rows, picks):
        out[i] = t
    return out


def _uniforms(rows: list[SamplingRow], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """One number in (0, 1] per row: seeded rows from their own stream."""
    u = 1.0 - torch.rand(len(rows), generator=generator, device=device, dtype=torch.float64)
    for j, row in enumerate(rows):
        if row.generator is not None:
            u[j] = 1.0 - torch.rand(1, generator=row.generator, device=device, dtype=torch.float64)
    return u


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    # fp64 running sum: the tail of a 262k-entry fp32 sum drifts enough to bias rare tokens.
    cdf = probs.double().cumsum(dim=-1)
    targets = (u * cdf[:, -1]).unsqueeze(1)
    # First index whose cdf reaches the target; target > 0 skips zero-probability tokens.
    return torch.searchsorted(cdf, targets).squeeze(1).clamp_(max=probs.shape[1] - 1)
