"""Projections through one of tts's streaming CPU kernels (cpu_linear.py for bf16 weights,
cpu_linear_fp32.py for fp32), each weight packed on its first use into one sequential
stream; every call the kernel does not take goes to a fallback (oneDNN).

Both kernels have the same interface (`pack_weight`, then `linear(rows, packed, outputs)`);
they differ in the weights they take and in how a weight is packed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType

import torch
from torch import nn

from tts_runtime.models.layers import LinearFn


class StreamedLinear:
    """The projections of `models` whose weights `takes` on `kernel`, each weight packed by
    `pack` on its first use (a copy beside the module's, counted by the memory profile like
    oneDNN's prepacked one); every other call (a weight that is not the models' or that the
    kernel cannot take, activations of another dtype than the weight, and calls of more than
    `max_rows` rows) on `fallback`."""

    def __init__(self, kernel: ModuleType, models: Sequence[nn.Module], fallback: LinearFn, *,
                 takes: Callable[[torch.Tensor], bool], pack: Callable[[torch.Tensor], torch.Tensor],
                 max_rows: int | None = None) -> None:
        self._kernel = kernel
        self._fallback = fallback
        self._pack = pack
        self._max_rows = max_rows
        self._weights = {id(p): p for model in models for p in model.parameters() if takes(p)}
        self._packed: dict[int, torch.Tensor] = {}

    @property
    def packed_weight_ids(self) -> tuple[int, ...]:
        """`id()`s of the weights packed for the kernel so far, in the order first used."""
        return tuple(self._packed)

    @property
    def fallback(self) -> LinearFn:
        """What serves the calls the kernel does not take."""
        return self._fallback

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        key = id(weight)
        too_many_rows = self._max_rows is not None and x.numel() > self._max_rows * x.shape[-1]
        if self._weights.get(key) is not weight or x.dtype != weight.dtype or too_many_rows:
            return self._fallback(x, weight, bias)
        packed = self._packed.get(key)
        if packed is None:
            packed = self._packed[key] = self._pack(weight.detach())
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        out = self._kernel.linear(rows, packed, weight.shape[0]).view(*x.shape[:-1], weight.shape[0])
        return out if bias is None else out + bias
