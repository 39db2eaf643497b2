"""Turns next-token logits into tokens, one row per sequence, with per-row parameters.

It runs on the driver (the default) or, with SiPipe's driver sampling switched off, on a
pipeline's last stage: everything a row needs travels with it as plain data.

Sampling inverts the CDF with one uniform number per row (filling a whole vocabulary row
with noise costs more than the forward of a small model on a CPU). A seeded row's number
is a function of plain data, (child seed, position), so its tokens depend neither on what
else shares the batch nor on which process samples it.

All tensor work runs on the logits' device. Per-row parameters reach it through
`values_on_device` (host_copy.py), so `sample_on_device` queues its work without waiting for
the device, and `sample`'s only host synchronisation is its final `.tolist()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tts_runtime.executor.host_copy import values_on_device


class SamplingParams(Protocol):
    """What sampling reads of a request's settings (engine/request.py's SamplingParams,
    which lives in the engine above)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float

    @property
    def greedy(self) -> bool: ...

    @property
    def uses_penalties(self) -> bool: ...


_SEED_MASK = 0x7FFF_FFFF_FFFF_FFFF


@dataclass
class SamplingRow:
    """What sampling one sequence's next token reads. Its tokens are the first `num_tokens`
    of `token_ids`, the sequence's own list and not a copy (copying it for every row of
    every step was ~6% of the host's time with async scheduling): the engine only appends to
    it (and takes back an EOS it just appended), past the row's tokens. A decode going ahead (async scheduling) counts the
    token its microbatch in flight samples, which the executor sets as `filled_token` before
    sampling; the list may or may not hold it yet."""

    params: SamplingParams
    token_ids: list[int]
    num_prompt_tokens: int
    seed: int | None  # the child's seed (`child_seed`); None draws from the shared stream
    num_tokens: int
    filled_token: int | None = None

    def tokens(self) -> list[int]:
        """Prompt + output so far (the repetition penalty reads both)."""
        if self.filled_token is None:
            return self.token_ids[:self.num_tokens]
        return [*self.token_ids[:self.num_tokens - 1], self.filled_token]


def child_seed(seed: int | None, child_index: int) -> int | None:
    """Each child of a seeded request gets its own reproducible stream."""
    return None if seed is None else hash((seed, child_index)) & _SEED_MASK


def seeded_uniform(seed: int, position: int) -> float:
    """The number in [0, 1) a seeded row draws for the token at `position`."""
    generator = torch.Generator().manual_seed(hash((seed, position)) & _SEED_MASK)
    return float(torch.rand(1, generator=generator, dtype=torch.float64))


def _apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    for i, row in enumerate(rows):
        p = row.params
        if not p.uses_penalties:
            continue
        tokens = row.tokens()
        if p.repetition_penalty != 1.0:
            seen = values_on_device(sorted(set(tokens)), torch.long, logits.device)
            values = logits[i, seen]
            logits[i, seen] = torch.where(values > 0, values / p.repetition_penalty, values * p.repetition_penalty)
        output = tokens[row.num_prompt_tokens:]
        if output and (p.frequency_penalty or p.presence_penalty):
            ids = values_on_device(output, torch.long, logits.device)
            # Counting by index_add: CUDA bincount reads the largest id back to the host.
            counts = torch.zeros(logits.shape[1], dtype=logits.dtype, device=logits.device)
            counts.index_add_(0, ids, torch.ones(len(output), dtype=logits.dtype, device=logits.device))
            logits[i] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def _filter(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Temperature, top-k, top-p, min-p; returns probabilities."""
    device = logits.device
    temps = values_on_device([r.params.temperature for r in rows], torch.float32, device).unsqueeze(1)
    logits = logits / temps
    top_k = [r.params.top_k for r in rows]
    top_p = [r.params.top_p for r in rows]
    if any(k > 0 for k in top_k) or any(p < 1.0 for p in top_p):
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        vocab = logits.shape[1]
        ks = values_on_device([k if k > 0 else vocab for k in top_k], torch.long, device).unsqueeze(1)
        ranks = torch.arange(vocab, device=device).unsqueeze(0)
        drop = ranks >= ks
        probs_sorted = sorted_logits.softmax(dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the token crossing it stays).
        mass_before = probs_sorted.cumsum(dim=-1) - probs_sorted
        drop |= mass_before >= values_on_device(top_p, torch.float32, device).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    min_p = [r.params.min_p for r in rows]
    if any(m > 0 for m in min_p):
        threshold = values_on_device(min_p, torch.float32, device).unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < threshold, 0.0)
    return probs


def sample(logits: torch.Tensor, rows: list[SamplingRow], generator: torch.Generator | None) -> list[int]:
    """logits [len(rows), vocab] -> one token id per row."""
    return sample_on_device(logits, rows, generator).tolist()


def sample_on_device(logits: torch.Tensor, rows: list[SamplingRow], generator: torch.Generator | None) -> torch.Tensor:
    """logits [len(rows), vocab] -> [len(rows)] int64 token ids on the logits' device, queued
    without waiting for the device."""
    # Penalties write in place: into a copy, never the caller's logits (an fp32 model's own
    # output, which the engine reuses for forked children, or a CUDA graph's static output).
    logits = logits.to(torch.float32, copy=any(r.params.uses_penalties for r in rows))
    _apply_penalties(logits, rows)
    random_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
    if not random_rows:
        return logits.argmax(dim=-1)
    sub_rows = [rows[i] for i in random_rows]
    if len(random_rows) == len(rows):
        return _inverse_cdf(_filter(logits, sub_rows), _uniforms(sub_rows, generator, logits.device))
    picks = logits.argmax(dim=-1)  # the greedy rows' tokens; the sampled rows are overwritten
    index = values_on_device(random_rows, torch.long, logits.device)
    probs = _filter(logits[index], sub_rows)
    picks[index] = _inverse_cdf(probs, _uniforms(sub_rows, generator, logits.device))
    return picks


def _uniforms(rows: list[SamplingRow], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """One number in (0, 1] per row: seeded rows from (seed, position), gathered into one write."""
    u = 1.0 - torch.rand(len(rows), generator=generator, device=device, dtype=torch.float64)
    seeded = [j for j, row in enumerate(rows) if row.seed is not None]
    if seeded:
        draws = [1.0 - seeded_uniform(rows[j].seed, rows[j].num_tokens) for j in seeded]
        u[values_on_device(seeded, torch.long, device)] = values_on_device(draws, torch.float64, device)
    return u


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    # fp64 running sum: the tail of a 262k-entry fp32 sum drifts enough to bias rare tokens.
    cdf = probs.double().cumsum(dim=-1)
    targets = (u * cdf[:, -1]).unsqueeze(1)
    # First index whose cdf reaches the target; target > 0 skips zero-probability tokens.
    return torch.searchsorted(cdf, targets).squeeze(1).clamp_(max=probs.shape[1] - 1)
