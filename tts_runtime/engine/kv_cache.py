"""The paged KV tensors: per layer a key and a value pool of fixed-size blocks."""

from __future__ import annotations

import torch

from tts_runtime.models.arch import ArchConfig


def bytes_per_block(arch: ArchConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.empty((), dtype=dtype).element_size()
    return block_size * arch.kv_bytes_per_token(element)


def allocate_kv_cache(arch: ArchConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    shape = (num_blocks, block_size, arch.num_kv_heads, arch.head_dim)
    # Zero-filled so a padded gather never reads NaN garbage into a masked softmax.
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(arch.num_layers)]
