"""gLLM token throttling (gLLM §3.1-3.2): how many prefill tokens one microbatch takes.

With several microbatches in a pipeline, a step that takes a large prefill stalls the
stages behind it while the others idle. gLLM sizes each microbatch's prefill by two
signals and leaves decodes to be spread evenly over the pipeline's microbatches (the
scheduler's decode lanes do that):

    #P = min(max(#WP / #T, #MinP), #MaxP * max((KVfree - θ) / (1 - θ), 0))

#WP (prompt tokens still to prefill, prefix-cache hits excluded) spread over #T
microbatches keeps prefill steady; the KV term shrinks prefill as free KV runs out, so
admissions do not outrun the decodes' growth and cause preemptions. Where the paper's
equation (3) is ambiguous we follow its reference code: #MinP floors only the
waiting-tokens term, and below θ no prefill is scheduled at all.
"""

from __future__ import annotations

from tts_runtime.config import ThrottleConfig


def prefill_token_budget(waiting_tokens: int, kv_free: float, config: ThrottleConfig) -> int:
    """#P for one microbatch. `kv_free`: the fraction of usable KV blocks that are free
    (cached-free ones included: a new sequence may evict them)."""
    if kv_free < config.kv_threshold:
        return 0
    waiting_term = max(waiting_tokens // config.iterations, config.min_prefill)
    kv_fraction = (kv_free - config.kv_threshold) / (1 - config.kv_threshold)
    kv_term = int(config.max_prefill * kv_fraction)  # floor: never more than the KV term allows
    return min(waiting_term, kv_term)
