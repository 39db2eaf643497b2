"""KV memory: zeroed, one pool per layer and K/V, and on a CPU (lazy zeroing) pages the kernel
hands out only as they are first written."""

from __future__ import annotations

import ctypes
import os

import pytest
import torch

from memory.pool import ChunkLayout, ElasticKVPool, MemberLayout
from tts_runtime.executor.kv_cache import allocate_kv_cache, zeroed_buffer

CPU = torch.device("cpu")


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_layers_pools_are_zeroed_and_apart(generator_model, dtype, lazy):
    arch = generator_model.arch
    caches = allocate_kv_cache(arch, 40, 8, dtype, CPU, lazy)
    assert len(caches) == arch.num_layers
    shape = (40, 8, arch.num_kv_heads, arch.head_dim)
    pools = [pool for pair in caches for pool in pair]
    assert all(pool.shape == shape and pool.dtype == dtype and pool.is_contiguous() for pool in pools)
    assert all(not pool.any() for pool in pools)
    caches[1][0][7].fill_(1.5)  # one block of layer 1's K
    assert [bool(pool.any()) for pool in pools] == [index == 2 for index in range(len(pools))]
    assert caches[1][0][7].eq(1.5).all() and not caches[1][0][6].any()


def test_a_forked_child_writes_its_own_copy():
    """The mapping is private: a process forked after the KV was made never writes into its
    parent's cache. The child writes through ctypes: a torch op in a forked child can hang
    on the parent's thread pool."""
    buffer = zeroed_buffer(1 << 20, CPU)
    buffer[:4096].fill_(3)
    child = os.fork()
    if child == 0:
        ctypes.memset(buffer.data_ptr(), 9, 1 << 20)
        os._exit(0 if ctypes.string_at(buffer.data_ptr() + 8192, 16) == b"\x09" * 16 else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert buffer[:4096].eq(3).all() and not buffer[4096:].any()


@pytest.mark.parametrize("lazy", [True, False], ids=["lazy", "eager"])
def test_a_cpu_kv_buffer_holds_memory_only_where_written_when_lazy(lazy):
    before = _resident_bytes()
    buffer = zeroed_buffer(1 << 30, CPU, lazy)
    created = _resident_bytes() - before
    if lazy:
        assert created < 64 << 20  # 1 GiB of KV, none of it touched yet
        buffer[: 128 << 20].fill_(1)
        assert _resident_bytes() - before >= 128 << 20
    else:
        assert created >= 1 << 30  # torch.zeros wrote every page
    assert not buffer[128 << 20 if lazy else 0:].any()  # reads as zeros, touched or not


def test_the_elastic_pool_buffer_follows_the_switch():
    layout = ChunkLayout(1 << 16, 16, {"a": MemberLayout(4096, 4096, 16), "b": MemberLayout(2048, 2048, 32)})
    for lazy in (True, False):
        pool = ElasticKVPool.split(layout, "a", "b", 2, CPU, lazy)
        assert pool.buffer.numel() == layout.num_chunks * layout.chunk_bytes and not pool.buffer.any()


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
