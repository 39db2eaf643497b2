"""The profiling forward: the largest step an engine can be asked to run, on dummy tokens.

`memory/profile.py` measures the peak memory of this forward to learn a model's peak
activations before any KV cache is sized. The step is one prefill of
`max_num_batched_tokens` tokens (the longest causal attention a step can hold) whose
output layer runs on `max_num_seqs` rows: full-vocabulary logits for a generating
engine, a few candidate columns for a scoring one (the PRM).
"""

from __future__ import annotations

from typing import Callable, Literal

import torch

from tts_runtime.executor.attention.backends import select_backend
from tts_runtime.executor.batch import AttentionMetadata, ModelInput
from tts_runtime.executor.local import LocalExecutor
from tts_runtime.executor.kv_cache import allocate_kv_cache
from tts_runtime.models.loader import LoadedModel

EngineRole = Literal["generate", "score"]
# A PRM scores a handful of candidate ids ("+"/"-", yes/no); two stand in for them.
_PROFILE_CANDIDATES = 2


def profile_tokens(loaded: LoadedModel, max_num_batched_tokens: int) -> int:
    """Tokens of the profiling step: the token budget, capped by the context."""
    return max(1, min(max_num_batched_tokens, loaded.arch.max_position_embeddings - 1))


def profiling_forward(loaded: LoadedModel, max_num_batched_tokens: int, max_num_seqs: int,
                      role: EngineRole, block_size: int, attention_backend: str = "auto") -> Callable[[], None]:
    """A closure running the profiling step. Its inputs and the few KV blocks it writes are
    allocated here, before the caller starts measuring, so the measured peak is activations only."""
    device = loaded.model.output_weight.device
    dtype = loaded.dtype
    tokens = profile_tokens(loaded, max_num_batched_tokens)
    num_blocks = -(-tokens // block_size)
    kv = allocate_kv_cache(loaded.arch, num_blocks, block_size, dtype, device)
    executor = LocalExecutor(loaded.model, kv, select_backend(attention_backend, device))
    rows = torch.arange(tokens - min(max_num_seqs, tokens), tokens, device=device)
    generator = torch.Generator(device="cpu").manual_seed(0)
    batch = ModelInput(
        input_ids=torch.randint(0, loaded.arch.vocab_size, (tokens,), generator=generator).to(device),
        positions=torch.arange(tokens, device=device),
        meta=AttentionMetadata(
            slot_mapping=torch.arange(tokens, device=device),
            num_decodes=0,
            decode_block_tables=torch.zeros((0, 1), dtype=torch.int32, device=device),
            decode_context_lens=torch.zeros(0, dtype=torch.int32, device=device),
            prefill_query_starts=[0], prefill_query_lens=[tokens], prefill_context_lens=[tokens],
            prefill_block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device).unsqueeze(0),
            block_size=block_size,
        ),
        sample_rows=rows if role == "generate" else rows[:0],
        score_rows=[] if role == "generate" else [
            (rows, torch.arange(_PROFILE_CANDIDATES, device=device))],
    )

    def run() -> None:
        executor.execute(batch)

    return run
