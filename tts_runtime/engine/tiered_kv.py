"""An engine's host KV tier at work: the tier (engine/host_tier.py) attached to the block
manager, its device copies (executor/kv_swap.py), and the points in a step where they run.
The engine drives it: copies before a forward, and after a launch, when the scheduler's
prefetch queued swap-ins, their copies while the forward runs."""

from __future__ import annotations

from tts_runtime.config import CacheConfig, ConfigError
from tts_runtime.engine.block_manager import BlockManager
from tts_runtime.engine.host_tier import HostTier
from tts_runtime.executor.kv_swap import HostKVCache


class TieredKV:
    """One engine's host tier, its device copies and the points where they run."""

    def __init__(self, blocks: BlockManager, copies: HostKVCache, prefetch: bool) -> None:
        self.blocks, self.copies, self.prefetch = blocks, copies, prefetch

    @classmethod
    def attach(cls, blocks: BlockManager, executor: object, cache: CacheConfig, block_bytes: int) -> TieredKV | None:
        """The tier `cache` asks for, attached to `blocks` (None when host_kv_bytes is 0)."""
        if not cache.host_kv_bytes:
            return None
        caches = getattr(executor, "kv_caches", None)
        if caches is None:
            raise ConfigError("--host-kv-memory needs the KV cache in this process: use --pp 1 and no overlap "
                              "worker processes, or turn the host KV tier off")
        slots = cache.host_kv_bytes // block_bytes
        if slots < 1:
            raise ConfigError(f"--host-kv-memory of {cache.host_kv_bytes} B holds no KV block "
                              f"({block_bytes} B each); raise it or use 0 (off)")
        blocks.host_tier = HostTier(slots, block_bytes)
        return cls(blocks, HostKVCache(caches, slots), cache.host_kv_prefetch)

    def before_forward(self) -> None:
        """Run the copies the coming forward reads (lookups' swap-ins, the saves they forced)."""
        self.blocks.record_swap_times(self.copies.apply(self.blocks.host_tier.take_plan()))
        self.copies.compute_started()

    def after_launch(self) -> None:
        """Mark the forward just launched; the engine may prefetch while it runs."""
        self.copies.compute_launched()

    def copy_prefetched(self) -> None:
        """Run the swap-ins the scheduler's prefetch queued, overlapping the running forward."""
        self.blocks.record_swap_times(self.copies.apply(self.blocks.host_tier.take_plan(overlap=True)))

    def finish(self) -> None:
        self.blocks.record_swap_times(self.copies.finish())
