"""How a batch's prefill chunks are cut into query tiles for the Triton prefill kernel.

One program of the kernel handles one tile: up to `block_m` consecutive queries of one chunk.
The table is plain data (torch on the host) so that both the eager path and the static
buffers a score CUDA graph reads can build it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

TILE_FIELDS = 4  # chunk, first query row in the flat batch, rows in the tile, position of the first row


def prefill_tile_table(query_lens: Sequence[int], query_starts: Sequence[int], context_lens: Sequence[int],
                       block_m: int) -> torch.Tensor:
    """[num_tiles, 4] int32 on the host. Longest tiles first, so the big ones do not start last
    and leave a tail."""
    qlens = torch.tensor(query_lens, dtype=torch.int64)
    starts = torch.tensor(query_starts, dtype=torch.int64)
    ctxs = torch.tensor(context_lens, dtype=torch.int64)
    per_chunk = (qlens + block_m - 1) // block_m
    chunk = torch.repeat_interleave(torch.arange(len(qlens)), per_chunk)
    first_tile = torch.cumsum(per_chunk, 0) - per_chunk
    offset = (torch.arange(len(chunk)) - first_tile[chunk]) * block_m
    rows = torch.clamp(qlens[chunk] - offset, max=block_m)
    pos0 = ctxs[chunk] - qlens[chunk] + offset
    tiles = torch.stack([chunk, starts[chunk] + offset, rows, pos0], 1)
    return tiles[torch.argsort(pos0 + rows, descending=True, stable=True)].to(torch.int32)


def max_tiles(num_tokens: int, num_chunks: int, block_m: int) -> int:
    """The most tiles `num_tokens` queries in at most `num_chunks` chunks can take: every chunk
    adds at most one partial tile to the full ones."""
    return -(-num_tokens // block_m) + min(num_chunks, num_tokens)
