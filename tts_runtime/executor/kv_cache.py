"""The paged KV tensors: per layer a key and a value pool of fixed-size blocks.

Two layouts. An engine on its own gets contiguous per-layer tensors (`allocate_kv_cache`).
Engines sharing an elastic budget get views into one byte buffer (`shared_kv_views`) in a
block-major layout: block j holds the K and V of every layer in one run of bytes, so the
bytes of a whole chunk of blocks can change hands between models with different shapes.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch

from tts_runtime.models.arch import ArchConfig

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def bytes_per_block(arch: ArchConfig, block_size: int, dtype: torch.dtype) -> int:
    return block_size * arch.kv_bytes_per_token(element_size(dtype))


def zeroed_buffer(nbytes: int, device: torch.device, lazy: bool = True) -> torch.Tensor:
    """`nbytes` of zeros (uint8): KV memory starts zeroed so that a padded gather never reads
    NaN garbage into a masked softmax.

    `lazy` on a CPU: an anonymous private mapping, whose pages the kernel hands out zeroed as
    they are first written, so the process holds memory only for the blocks a run has used.
    torch.zeros writes every page at start: the demo job then peaks at 8.3 GiB resident
    instead of 3.0 and starts 1.2 s later (docs/benchmarks/lazy_kv.md)."""
    device = torch.device(device)
    if not lazy or device.type != "cpu" or nbytes == 0:
        return torch.zeros(nbytes, dtype=torch.uint8, device=device)
    # Private, so that a process forked later writes its own copy. The tensor holds a
    # reference to the mapping, which is unmapped when the last view of it goes.
    return torch.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), dtype=torch.uint8)


def allocate_kv_cache(arch: ArchConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                      device: torch.device, lazy_zeroing: bool = True) -> KVCaches:
    """Per layer a contiguous K and V pool, all views of one zeroed buffer."""
    shape = (num_blocks, block_size, arch.num_kv_heads, arch.head_dim)
    elements = math.prod(shape)
    pools = zeroed_buffer(2 * arch.num_layers * elements * element_size(dtype), device, lazy_zeroing).view(dtype)
    views = [pools[index * elements:(index + 1) * elements].view(shape) for index in range(2 * arch.num_layers)]
    return list(zip(views[0::2], views[1::2]))


def shared_kv_views(buffer: torch.Tensor, arch: ArchConfig, num_blocks: int, block_size: int,
                    block_stride_bytes: int, dtype: torch.dtype) -> KVCaches:
    """Per-layer [num_blocks, block_size, kv_heads, head_dim] views of a flat uint8 buffer.

    Block j starts at byte j * block_stride_bytes and holds, layer by layer, that layer's
    K then V for its block_size tokens; the views are strided over blocks (attention
    backends index blocks by stride, never by assuming a contiguous layer)."""
    size = element_size(dtype)
    if block_stride_bytes % size or block_stride_bytes < bytes_per_block(arch, block_size, dtype):
        raise ValueError(f"block stride {block_stride_bytes} B cannot hold a {dtype} block")
    typed = buffer.view(dtype)
    stride = block_stride_bytes // size
    heads, dim = arch.num_kv_heads, arch.head_dim
    per_layer = block_size * heads * dim  # elements of one layer's K (or V) in a block
    shape, strides = (num_blocks, block_size, heads, dim), (stride, heads * dim, dim, 1)
    return [(typed.as_strided(shape, strides, typed.storage_offset() + 2 * layer * per_layer),
             typed.as_strided(shape, strides, typed.storage_offset() + (2 * layer + 1) * per_layer))
            for layer in range(arch.num_layers)]


def copy_blocks(kv_caches: KVCaches, copies: torch.Tensor) -> None:
    """Copy whole blocks, copies[0] to copies[1], in every layer held here."""
    source, destination = copies
    for k_cache, v_cache in kv_caches:
        k_cache[destination] = k_cache[source]
        v_cache[destination] = v_cache[source]


@dataclass
class KVAllocation:
    """KV memory an engine is handed by its owner (the runtime's elastic pool) instead of
    allocating its own: views addressing `num_blocks` ids, of which `usable` are the
    engine's at start; the owner moves ids in and out at run time."""

    caches: KVCaches
    num_blocks: int
    usable: list[int]
