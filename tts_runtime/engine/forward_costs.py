"""What one forward of an engine costs, as a function of its shape, fitted from the forwards it ran.

A forward's seconds are modelled as fixed + per decode sequence x its decodes + per prefill
token x its prefill tokens. On hardware where streaming the weights dominates a narrow
decode (a CPU in bf16, a GPU), the fixed part is most of a decode step, and fewer, wider
forwards of the same tokens take less time: the fit says how much less, which bounds what
any batching policy can gain (`tts bench cohost`).

The accumulator keeps the sums of a least-squares fit rather than the forwards themselves,
so that it adds and subtracts like the other run counters (engines outlive runs).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class ForwardCost:
    fixed_seconds: float
    seconds_per_decode: float
    seconds_per_prefill_token: float

    def seconds(self, forwards: float, decodes: float, prefill_tokens: float) -> float:
        return (forwards * self.fixed_seconds + decodes * self.seconds_per_decode
                + prefill_tokens * self.seconds_per_prefill_token)


@dataclass(frozen=True)
class ForwardCostSums:
    """Sums over forwards of 1, d, p, d², p², dp, s, sd, sp (d decodes, p prefill tokens, s seconds)."""

    n: float = 0.0
    d: float = 0.0
    p: float = 0.0
    dd: float = 0.0
    pp: float = 0.0
    dp: float = 0.0
    s: float = 0.0
    sd: float = 0.0
    sp: float = 0.0

    def add(self, decodes: int, prefill_tokens: int, seconds: float) -> ForwardCostSums:
        d, p, s = float(decodes), float(prefill_tokens), seconds
        return ForwardCostSums(self.n + 1, self.d + d, self.p + p, self.dd + d * d, self.pp + p * p,
                               self.dp + d * p, self.s + s, self.sd + s * d, self.sp + s * p)

    def __sub__(self, other: ForwardCostSums) -> ForwardCostSums:
        return ForwardCostSums(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def fit(self) -> ForwardCost | None:
        """Least squares over the forwards, or None with fewer than three. A shape that never
        varies (a PRM never decodes) gets no cost of its own: the pseudo-inverse leaves it 0."""
        if self.n < 3:
            return None
        gram = torch.tensor([[self.n, self.d, self.p], [self.d, self.dd, self.dp], [self.p, self.dp, self.pp]],
                            dtype=torch.float64)
        moments = torch.tensor([self.s, self.sd, self.sp], dtype=torch.float64)
        fixed, per_decode, per_token = (torch.linalg.pinv(gram, rtol=1e-10) @ moments).tolist()
        return ForwardCost(fixed, per_decode, per_token)


def widest_forward_seconds(sums: ForwardCostSums, width: int, token_budget: int) -> float | None:
    """The fitted seconds of the same decodes and prefill tokens in forwards as wide as they
    can be: `width` decodes each (every sequence in flight) and at most `token_budget` tokens.
    None when there are too few forwards to fit."""
    cost = sums.fit()
    if cost is None:
        return None
    forwards = max(sums.d / width, (sums.d + sums.p) / token_budget)
    return cost.seconds(forwards, sums.d, sums.p)
