"""The GPU execution path: fused Triton ops, decode CUDA graphs, device sampling, device
memory facts and the GPU benchmark.

On a machine without CUDA: the CPU path must be untouched by the GPU switches, the fused
kernels run under the Triton interpreter (small shapes), the padded static-buffer decode
forward that a CUDA graph captures runs eagerly with interpreted kernels, and the GPU
benchmark refuses cleanly. Tests marked ``gpu`` need a CUDA device and run the real thing.
"""

from __future__ import annotations

from dataclasses import replace

import os
import warnings

import pytest
import torch

if not torch.cuda.is_available():
    # Must precede triton's first import for the kernels to run interpreted (conftest also does this).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from tts_runtime import CacheConfig, ConfigError, Engine, EngineConfig, SamplingParams  # noqa: E402
from tts_runtime.executor.attention.attention import TorchAttention  # noqa: E402
from tts_runtime.executor.batch import AttentionMetadata, ModelInput  # noqa: E402
from tts_runtime.executor.cuda_graphs import (PAD_SLOT, StaticDecodeBuffers, capture_sizes,  # noqa: E402
                                            padded_decode_logits)
from tts_runtime.executor.device_memory import device_memory_info  # noqa: E402
from tts_runtime.executor.kv_cache import allocate_kv_cache  # noqa: E402
from tts_runtime.executor.layer_ops import cpu_elementwise_ops  # noqa: E402
from tts_runtime.executor.local import LocalExecutor  # noqa: E402
from tts_runtime.executor.score_graphs import StaticScoreBuffers, padded_score_hidden  # noqa: E402
from tts_runtime.executor.sampler import SamplingRow, child_seed, sample  # noqa: E402
from tts_runtime.models import layers  # noqa: E402
from tts_runtime.models.arch import arch_from_hf  # noqa: E402
from tts_runtime.models.decoder import DecoderModel  # noqa: E402
from tts_runtime.models.layers import EAGER_OPS  # noqa: E402

from tests.helpers import GENERATOR, PRM, compile_kernels_for_sm90, shared_data_dir  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])]


@pytest.fixture
def kernels(request):
    """Fused-op kernels for a device: interpreted on CPU, compiled on CUDA."""
    device = request.param if hasattr(request, "param") else "cpu"
    if device == "cpu":
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(tl.sum, InterpretedFunction):
            pytest.skip("triton was imported before TRITON_INTERPRET=1; run this module alone")
    from tts_runtime.models import fused_ops

    return fused_ops, torch.device(device)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


# fp32: summation order only. bf16: both sides round at the same points, but a different
# fp32 sum can move a value across a rounding boundary (8-bit mantissa: ~0.4% per ulp).
REL_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


# -- the eager ops are HF's formulas, bit for bit ---------------------------------------------

def test_eager_ops_match_hf_formulas_exactly():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 48, generator=gen)
    llama, gemma = LlamaRMSNorm(48, eps=1e-5), Gemma3RMSNorm(48, eps=1e-6)
    with torch.no_grad():
        llama.weight.normal_(1.0, 0.1, generator=gen)
        gemma.weight.normal_(0.0, 0.1, generator=gen)
    assert torch.equal(layers.rms_norm(x, llama.weight, 1e-5, False), llama(x))
    assert torch.equal(layers.rms_norm(x, gemma.weight, 1e-6, True), gemma(x))

    gate_up = torch.randn(5, 2 * 24, generator=gen)
    gate, up = gate_up.split(24, dim=-1)
    assert torch.equal(layers.act_and_mul(gate_up, "silu"), torch.nn.functional.silu(gate) * up)

    q, k = torch.randn(5, 6, 16, generator=gen), torch.randn(5, 2, 16, generator=gen)
    inv = layers.inverse_frequencies(arch_from_hf(_tiny_llama()).layer_rope[0], 16)
    cos, sin = layers.rotary_cos_sin(inv, torch.arange(3, 8), torch.float32)
    # HF: [batch, heads, seq, dim] with cos/sin [batch, seq, dim].
    hf_q, hf_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                      cos.squeeze(1)[None], sin.squeeze(1)[None])
    ours_q, ours_k = layers.rotary_qk(q, k, cos, sin)
    assert torch.equal(ours_q, hf_q[0].transpose(0, 1)) and torch.equal(ours_k, hf_k[0].transpose(0, 1))


def test_gpu_switches_leave_the_cpu_path_unchanged(generator_model):
    """On CPU the switches (all on by default) change nothing: no graph runners, not the
    Triton ops but the CPU ones (cpu_fused_ops), the same ops and tokens as with both off."""
    prompt, greedy = [1, 2, 3, 4, 5, 6, 7, 8, 9], SamplingParams(temperature=0, max_tokens=3)
    small = CacheConfig(num_blocks=4)
    on = Engine(generator_model.name, EngineConfig(cache=small, cuda_graphs=True, compile=True, score_graphs=True),
                loaded=generator_model)
    assert on.executor.graphs is None and on.executor.score_graphs is None
    ops = on.executor.ops
    cpu_ops = cpu_elementwise_ops()
    assert (ops.rms_norm, ops.rotary_qk, ops.act_and_mul) == (cpu_ops.rms_norm, cpu_ops.rotary_qk,
                                                              cpu_ops.act_and_mul)
    got_on = on.generate([prompt], greedy)[0].completions[0].token_ids
    off = Engine(generator_model.name, EngineConfig(cache=small, cuda_graphs=False, compile=False),
                 loaded=generator_model)
    # The same ops; each executor keeps its own prepacked weights.
    assert replace(off.executor.ops, linear=None) == replace(ops, linear=None)
    assert type(off.executor.ops.linear) is type(ops.linear)
    assert off.generate([prompt], greedy)[0].completions[0].token_ids == got_on


# -- fused Triton ops against the eager ones ---------------------------------------------------

@pytest.mark.parametrize("kernels", DEVICES, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gemma_style", [False, True])
def test_fused_rms_norm(kernels, dtype, gemma_style):
    fused, device = kernels
    gen = torch.Generator().manual_seed(1)
    dim = 2048 if device.type == "cuda" else 80  # not a power of two on CPU: masked tail
    weight = (torch.randn(dim, generator=gen) * 0.1 + (0.0 if gemma_style else 1.0)).to(dtype).to(device)
    rows = torch.randn(7, dim, generator=gen).to(dtype).to(device)
    # Per-head norms (Gemma's q/k norms) read strided [T, H, D] views of the qkv output.
    qkv = torch.randn(7, 5 * dim, generator=gen).to(dtype).to(device)
    heads = qkv[:, : 3 * dim].view(7, 3, dim)
    for x in (rows, heads):
        out = fused.rms_norm(x, weight, 1e-5, gemma_style)
        ref = layers.rms_norm(x, weight, 1e-5, gemma_style)
        assert out.shape == ref.shape and out.dtype == ref.dtype
        assert rel_err(out, ref) <= REL_TOL[dtype]


@pytest.mark.parametrize("kernels", DEVICES, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["silu", "gelu_pytorch_tanh"])
def test_fused_act_and_mul(kernels, dtype, activation):
    fused, device = kernels
    gen = torch.Generator().manual_seed(2)
    intermediate = 8192 if device.type == "cuda" else 1100  # more than one column block
    gate_up = (torch.randn(5, 2 * intermediate, generator=gen) * 2).to(dtype).to(device)
    out = fused.act_and_mul(gate_up, activation)
    ref = layers.act_and_mul(gate_up, activation)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    assert rel_err(out, ref) <= REL_TOL[dtype]


@pytest.mark.parametrize("kernels", DEVICES, indirect=True)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rotary_in_place(kernels, dtype):
    fused, device = kernels
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, head_dim = 9, 3, 64  # SmolLM2's GQA shape: 9 is not a power of two
    tokens = 6
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype).to(device)
    v_before = qkv[:, (heads + kv_heads) * head_dim:].clone()
    q, k, _ = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k = q.view(tokens, heads, head_dim), k.view(tokens, kv_heads, head_dim)
    inv = layers.inverse_frequencies(arch_from_hf(_tiny_llama()).layer_rope[0], head_dim).to(device)
    cos, sin = layers.rotary_cos_sin(inv, torch.arange(100, 100 + tokens, device=device), dtype)
    ref_q, ref_k = layers.rotary_qk(q, k, cos, sin)
    out_q, out_k = fused.rotary_qk(q, k, cos, sin)
    assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()  # in place
    assert rel_err(out_q, ref_q) <= REL_TOL[dtype] and rel_err(out_k, ref_k) <= REL_TOL[dtype]
    assert torch.equal(qkv[:, (heads + kv_heads) * head_dim:], v_before)  # values untouched


@pytest.mark.parametrize("kernels", ["cpu"], indirect=True)
def test_fused_ops_fall_back_to_eager_where_they_do_not_apply(kernels):
    fused, _ = kernels
    gate_up = torch.randn(3, 16)
    assert torch.equal(fused.act_and_mul(gate_up, "gelu"), layers.act_and_mul(gate_up, "gelu"))
    x = torch.randn(3, 16)
    w = torch.ones(16, dtype=torch.float64)  # a weight of another dtype promotes the eager result
    assert torch.equal(fused.rms_norm(x, w, 1e-5, False), layers.rms_norm(x, w, 1e-5, False))


# The interpreter accepts things the compiler rejects, so compile the fused kernels for sm_90
# at the seed models' shapes with the launch configs fused_ops picks (evals/kernel_resources.py).
@pytest.mark.skipif(HAS_CUDA, reason="the gpu cases compile and run the kernels")
def test_fused_kernels_compile_for_sm90_without_spilling():
    builds = compile_kernels_for_sm90("fused")
    assert {b["kernel"] for b in builds} == {"rms_norm_kernel", "act_and_mul_kernel", "rotary_kernel"}
    assert all(b["stack_bytes"] == 0 for b in builds), builds


def _tiny_llama() -> dict:
    return {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 96,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 256,
            "tie_word_embeddings": True, "eos_token_id": 1}


def _tiny_gemma() -> dict:
    return {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 96,
            "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "max_position_embeddings": 256, "sliding_window": 8, "query_pre_attn_scalar": 16,
            "layer_types": ["sliding_attention", "full_attention"], "hidden_activation": "gelu_pytorch_tanh",
            "eos_token_id": 1}


def _tiny_model(config: dict, seed: int = 0) -> DecoderModel:
    torch.manual_seed(seed)
    model = DecoderModel(arch_from_hf(config)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:  # non-trivial norm weights, so the weight path is exercised
                param.normal_(1.0 if config["model_type"] == "llama" else 0.0, 0.1)
            elif "embed" in name:  # built empty: the loader fills it (models/decoder.py)
                param.normal_(0.0, 1.0)
    return model


def _prefill_meta(tokens: int, block_size: int) -> AttentionMetadata:
    blocks = -(-tokens // block_size)
    return AttentionMetadata(
        slot_mapping=torch.arange(tokens), num_decodes=0,
        decode_block_tables=torch.zeros(0, 1, dtype=torch.int32),
        decode_context_lens=torch.zeros(0, dtype=torch.int32),
        prefill_query_starts=[0], prefill_query_lens=[tokens], prefill_context_lens=[tokens],
        prefill_block_tables=torch.arange(blocks, dtype=torch.int32)[None], block_size=block_size)


@pytest.mark.parametrize("kernels", ["cpu"], indirect=True)
@pytest.mark.parametrize("config", [_tiny_llama(), _tiny_gemma()], ids=["llama", "gemma3"])
def test_forward_runs_the_ops_it_is_given(kernels, config):
    fused, _ = kernels
    model = _tiny_model(config)
    arch = model.arch
    tokens, block_size = 12, 8
    ids = torch.randint(0, arch.vocab_size, (tokens,), generator=torch.Generator().manual_seed(4))

    calls = {"rms_norm": 0, "rotary_qk": 0, "act_and_mul": 0}

    def counted(name: str):
        def run(*args):
            calls[name] += 1
            return getattr(fused.FUSED_OPS, name)(*args)
        return run

    counting = layers.LayerOps(counted("rms_norm"), counted("rotary_qk"), counted("act_and_mul"))

    def logits(ops: layers.LayerOps) -> torch.Tensor:
        kv = allocate_kv_cache(arch, 2, block_size, torch.float32, torch.device("cpu"))
        with torch.inference_mode():
            hidden = model(ids, torch.arange(tokens), kv, _prefill_meta(tokens, block_size), TorchAttention(), ops)
            return model.compute_logits(hidden)

    eager = logits(EAGER_OPS)
    assert rel_err(logits(counting), eager) <= 1e-5
    # Per layer: 2 norms (+ q/k norms and 2 feed-forward sandwich norms for Gemma), one rotary,
    # one activation; plus the final norm. Every one of them went through the ops given.
    assert calls == {"rms_norm": arch.num_layers * (6 if arch.is_gemma else 2) + 1,
                     "rotary_qk": arch.num_layers, "act_and_mul": arch.num_layers}
    assert torch.equal(logits(EAGER_OPS), eager)


# -- static decode buffers and the padded forward a CUDA graph captures -----------------------

def _decode_batch(contexts: list[int], tables: list[list[int]], block_size: int, width: int,
                  device: torch.device, vocab: int = 96, seed: int = 0) -> ModelInput:
    """A decode-only batch: sequence i has contexts[i] tokens (the new one included)."""
    gen = torch.Generator().manual_seed(seed)
    positions = [c - 1 for c in contexts]
    slots = [t[p // block_size] * block_size + p % block_size for t, p in zip(tables, positions)]
    padded = [t + [0] * (width - len(t)) for t in tables]
    n = len(contexts)
    return ModelInput(
        input_ids=torch.randint(0, vocab, (n,), generator=gen).to(device),
        positions=torch.tensor(positions, device=device),
        meta=AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=device), num_decodes=n,
            decode_block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
            decode_context_lens=torch.tensor(contexts, dtype=torch.int32, device=device),
            prefill_query_starts=[], prefill_query_lens=[], prefill_context_lens=[],
            prefill_block_tables=torch.zeros(0, width, dtype=torch.int32, device=device), block_size=block_size),
        sample_rows=torch.arange(n, device=device),
    )


def test_capture_sizes():
    assert capture_sizes(256) == (1, 2, 4, 8, *range(16, 257, 16))
    assert capture_sizes(100)[-2:] == (96, 100)  # the scheduler's cap is always captured
    assert capture_sizes(1) == (1,)
    assert capture_sizes(4096)[-1] == 256  # larger decode batches run eagerly
    assert capture_sizes(64, sizes=(1, 8, 32, 128)) == (1, 8, 32, 64)


def _restore(kv: list[tuple[torch.Tensor, torch.Tensor]], saved: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for (k, v), (k0, v0) in zip(kv, saved):
        k.copy_(k0)
        v.copy_(v0)


def _assert_wrote_only_the_batch(batch: ModelInput, before: list, written: list, eager: list, tol: float) -> None:
    """The KV `written` by a padded (or graph) forward differs from `before` in exactly the
    batch's slots, in every layer, and holds there what the eager forward wrote."""
    real = sorted(batch.meta.slot_mapping.tolist())
    for (kw, vw), (k0, v0), (ke, ve) in zip(written, before, eager):
        for new, old, eager_new in ((kw, k0, ke), (vw, v0, ve)):
            changed = (new != old).flatten(2).any(-1).flatten().nonzero().flatten().tolist()
            assert changed == real
            assert rel_err(new.flatten(0, 1)[real], eager_new.flatten(0, 1)[real]) <= tol


def test_static_buffers_fill_and_reset_padding():
    bs = 4
    buffers = StaticDecodeBuffers.allocate(8, 6, bs, torch.device("cpu"))
    assert (buffers.slot_mapping == PAD_SLOT).all() and (buffers.context_lens == 1).all()
    big = _decode_batch([5, 9, 13, 2, 7, 20, 3], [[1, 2], [3, 4, 5], [6, 7, 8, 9], [10], [11, 12],
                                                   [13, 14, 15, 16, 17], [18]], bs, 5, torch.device("cpu"))
    buffers.fill(big, 8)
    assert buffers.slot_mapping[:7].tolist() == big.meta.slot_mapping.tolist()
    assert buffers.block_tables[5, :5].tolist() == [13, 14, 15, 16, 17]

    small = _decode_batch([6, 3], [[21, 22], [23]], bs, 2, torch.device("cpu"), seed=1)
    buffers.fill(small, 4)
    assert buffers.input_ids[:2].tolist() == small.input_ids.tolist()
    assert buffers.positions[:2].tolist() == [5, 2]
    assert buffers.slot_mapping[:4].tolist() == [22 * bs + 1, 23 * bs + 2, PAD_SLOT, PAD_SLOT]
    assert buffers.context_lens[:4].tolist() == [6, 3, 1, 1]
    assert buffers.block_tables[:4].tolist() == [[21, 22, 0, 0, 0, 0], [23, 0, 0, 0, 0, 0]] + [[0] * 6] * 2
    assert buffers.input_ids[2:4].tolist() == [0, 0] and buffers.positions[2:4].tolist() == [0, 0]

    meta = buffers.metadata(4)
    assert meta.num_decodes == 4 and meta.num_prefills == 0 and meta.block_size == bs
    # Views, not copies: a graph captured over them reads every later fill.
    assert meta.slot_mapping.data_ptr() == buffers.slot_mapping.data_ptr()
    assert meta.decode_block_tables.data_ptr() == buffers.block_tables.data_ptr()
    assert meta.decode_context_lens.data_ptr() == buffers.context_lens.data_ptr()


def test_static_buffers_accept_only_decode_batches_that_fit():
    bs = 4
    buffers = StaticDecodeBuffers.allocate(4, 3, bs, torch.device("cpu"))
    ok = _decode_batch([5, 9], [[1, 2], [3, 4, 5]], bs, 3, torch.device("cpu"))
    assert buffers.fits(ok)
    too_many = _decode_batch([2] * 5, [[i] for i in range(5)], bs, 1, torch.device("cpu"))
    too_wide = _decode_batch([15], [[1, 2, 3, 4]], bs, 4, torch.device("cpu"))
    assert not buffers.fits(too_many) and not buffers.fits(too_wide)
    mixed = _decode_batch([5, 9], [[1, 2], [3, 4, 5]], bs, 3, torch.device("cpu"))
    mixed.meta.prefill_query_lens.append(3)  # a prefill chunk rides along
    scored = _decode_batch([5, 9], [[1, 2], [3, 4, 5]], bs, 3, torch.device("cpu"))
    scored.score_rows.append((torch.tensor([0]), torch.tensor([1, 2])))
    assert not buffers.fits(mixed) and not buffers.fits(scored)


@pytest.mark.parametrize("kernels", ["cpu"], indirect=True)
def test_padded_decode_forward_writes_only_real_slots(kernels):
    """The forward a CUDA graph captures, run eagerly with interpreted Triton kernels: after a
    larger batch left its rows behind, a 3-sequence step padded to 8 writes exactly its 3
    slots in every layer and matches the unpadded eager step."""
    from tts_runtime.executor.attention.triton_attention import TritonAttention

    model = _tiny_model(_tiny_llama())
    arch, bs, device = model.arch, 8, torch.device("cpu")
    kv = allocate_kv_cache(arch, 12, bs, torch.float32, device)
    gen = torch.Generator().manual_seed(5)
    for k, v in kv:  # prefixes already cached
        k.copy_(torch.randn(k.shape, generator=gen))
        v.copy_(torch.randn(v.shape, generator=gen))
    before = [(k.clone(), v.clone()) for k, v in kv]

    buffers = StaticDecodeBuffers.allocate(8, 4, bs, device)
    # A previous step of 7 sequences whose slots lie in blocks the next step does not own.
    stale = _decode_batch([3, 4, 5, 6, 7, 8, 2], [[0], [5], [6], [8], [10], [11], [3]], bs, 4, device)
    buffers.fill(stale, 8)
    batch = _decode_batch([5, 11, 20], [[3], [7, 1], [4, 9, 2]], bs, 3, device, seed=6)
    buffers.fill(batch, 8)
    backend = TritonAttention()
    with torch.inference_mode():
        padded = padded_decode_logits(model, kv, backend, EAGER_OPS, buffers, 8)[:3]
    after_padded = [(k.clone(), v.clone()) for k, v in kv]

    _restore(kv, before)
    eager = LocalExecutor(model, kv, backend).execute(batch).sample_logits
    assert rel_err(padded, eager) <= 1e-5

    # Padding rows wrote nothing, stale rows were reset.
    _assert_wrote_only_the_batch(batch, before, after_padded, kv, 1e-5)


# -- static score buffers and the padded forward a score CUDA graph captures --------------------

def _score_batch(chunks: list[tuple[int, int, list[int]]], block_size: int, width: int, device: torch.device,
                 vocab: int = 96, seed: int = 0) -> ModelInput:
    """A score-only batch: chunk i = (context length, new tokens, blocks): its new tokens sit at
    the end of its context, after a cached prefix. Two score groups read a few rows."""
    gen = torch.Generator().manual_seed(seed)
    positions, slots, starts = [], [], []
    for context, new, table in chunks:
        starts.append(len(positions))
        for p in range(context - new, context):
            positions.append(p)
            slots.append(table[p // block_size] * block_size + p % block_size)
    n = len(positions)
    return ModelInput(
        input_ids=torch.randint(0, vocab, (n,), generator=gen).to(device),
        positions=torch.tensor(positions, device=device),
        meta=AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=device), num_decodes=0,
            decode_block_tables=torch.zeros(0, width, dtype=torch.int32, device=device),
            decode_context_lens=torch.zeros(0, dtype=torch.int32, device=device),
            prefill_query_starts=starts, prefill_query_lens=[new for _, new, _ in chunks],
            prefill_context_lens=[context for context, _, _ in chunks],
            prefill_block_tables=torch.tensor([t + [0] * (width - len(t)) for _, _, t in chunks], dtype=torch.int32,
                                              device=device),
            block_size=block_size),
        sample_rows=torch.zeros(0, dtype=torch.long, device=device),
        score_rows=[(torch.tensor([0, n - 1], device=device), torch.tensor([3, 5], device=device)),
                    (torch.tensor([n // 2], device=device), torch.tensor([7, 11, 2], device=device))],
    )


def test_static_score_buffers_fill_and_reset_padding():
    bs, block_m = 4, 4
    buffers = StaticScoreBuffers.allocate(32, 4, 6, bs, block_m, torch.device("cpu"))
    assert buffers.num_tiles(32) == buffers.tiles.shape[0] == 8 + 4  # full tiles + one partial per chunk
    big = _score_batch([(20, 9, [1, 2, 3, 4, 5]), (7, 7, [6, 7]), (13, 10, [8, 9, 10, 11])], bs, 5,
                       torch.device("cpu"))
    buffers.fill(big, 32)
    small = _score_batch([(11, 3, [12, 13, 14]), (6, 2, [15, 16])], bs, 3, torch.device("cpu"), seed=1)
    buffers.fill(small, 16)
    assert buffers.input_ids[:5].tolist() == small.input_ids.tolist()
    assert buffers.positions[:16].tolist() == [8, 9, 10, 4, 5] + [0] * 11
    assert buffers.slot_mapping[:16].tolist() == small.meta.slot_mapping.tolist() + [PAD_SLOT] * 11
    assert buffers.block_tables[:2, :3].tolist() == [[12, 13, 14], [15, 16, 0]]
    # The batch's tiles (chunk, first row, rows, first position), then empty ones up to the grid.
    assert buffers.tiles[:2].tolist() == [[0, 0, 3, 8], [1, 3, 2, 4]]
    assert buffers.tiles[2:buffers.num_tiles(16)].abs().sum().item() == 0
    meta = buffers.metadata(16)
    assert meta.num_decodes == 0 and meta.prefill_tiles.shape[0] == buffers.num_tiles(16) == 8
    # Views, not copies: a graph captured over them reads every later fill.
    assert meta.slot_mapping.data_ptr() == buffers.slot_mapping.data_ptr()
    assert meta.prefill_tiles.data_ptr() == buffers.tiles.data_ptr()
    assert meta.prefill_block_tables.data_ptr() == buffers.block_tables.data_ptr()
    buffers.clear(32)
    assert (buffers.slot_mapping == PAD_SLOT).all() and buffers.tiles.abs().sum().item() == 0


def test_static_score_buffers_accept_only_score_batches_that_fit():
    bs, cpu = 4, torch.device("cpu")
    buffers = StaticScoreBuffers.allocate(16, 2, 3, bs, 4, cpu)
    assert buffers.fits(_score_batch([(9, 5, [1, 2, 3]), (4, 4, [4])], bs, 3, cpu))
    too_many_tokens = _score_batch([(12, 12, [1, 2, 3]), (5, 5, [4, 5])], bs, 3, cpu)
    too_many_chunks = _score_batch([(2, 2, [1]), (2, 2, [2]), (2, 2, [3])], bs, 1, cpu)
    too_wide = _score_batch([(15, 2, [1, 2, 3, 4])], bs, 4, cpu)
    assert not any(buffers.fits(b) for b in (too_many_tokens, too_many_chunks, too_wide))
    sampled = _score_batch([(9, 5, [1, 2, 3])], bs, 3, cpu)
    sampled.sample_rows = torch.tensor([4])
    unscored = _score_batch([(9, 5, [1, 2, 3])], bs, 3, cpu)
    unscored.score_rows.clear()
    decodes = _decode_batch([5, 9], [[1, 2], [3, 4, 5]], bs, 3, cpu)
    assert not any(buffers.fits(b) for b in (sampled, unscored, decodes))


# Empty tiles divide 0 by 0 in rows they never store; the interpreter computes them anyway.
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
@pytest.mark.parametrize("kernels", ["cpu"], indirect=True)
@pytest.mark.parametrize("config", [_tiny_llama(), _tiny_gemma()], ids=["llama", "gemma3"])
def test_padded_score_forward_matches_eager_scores_and_writes_only_real_slots(kernels, config):
    """The forward a score CUDA graph captures, run eagerly with interpreted Triton kernels:
    after a larger batch left its rows behind, three chunks over cached prefixes (one past the
    gemma's sliding window) padded to 32 tokens score as the unpadded eager forward and write
    exactly their own slots in every layer."""
    from tts_runtime.executor.attention.triton_attention import TritonAttention
    from tts_runtime.executor.local import compute_output_logits

    model = _tiny_model(config)
    arch, bs, device = model.arch, 4, torch.device("cpu")
    kv = allocate_kv_cache(arch, 24, bs, torch.float32, device)
    gen = torch.Generator().manual_seed(5)
    for k, v in kv:  # the prefixes already cached
        k.copy_(torch.randn(k.shape, generator=gen))
        v.copy_(torch.randn(v.shape, generator=gen))
    before = [(k.clone(), v.clone()) for k, v in kv]
    backend = TritonAttention(block_m=16, block_n=16)
    buffers = StaticScoreBuffers.allocate(32, 4, 6, bs, backend.tile_sizes(arch.head_dim, torch.float32)[0], device)
    # More tiles than the next batch, over the rows it uses, in blocks it does not own.
    stale = _score_batch([(4, 4, [19]), (4, 4, [20]), (4, 4, [21]), (20, 20, [0, 2, 4, 6, 8])], bs, 5, device)
    buffers.fill(stale, 32)
    batch = _score_batch([(19, 6, [1, 3, 5, 7, 9]), (5, 5, [11, 13]), (14, 3, [15, 16, 17, 18])], bs, 5,
                         device, vocab=arch.vocab_size, seed=6)
    buffers.fill(batch, 32)
    with torch.inference_mode():
        hidden = padded_score_hidden(model, kv, backend, EAGER_OPS, buffers, 32)[:batch.input_ids.shape[0]]
        padded = compute_output_logits(model, hidden, batch, EAGER_OPS).score_logits
    after_padded = [(k.clone(), v.clone()) for k, v in kv]

    _restore(kv, before)
    eager = LocalExecutor(model, kv, backend).execute(batch).score_logits
    assert [p.shape for p in padded] == [e.shape for e in eager] == [(2, 2), (1, 3)]
    assert max(rel_err(p, e) for p, e in zip(padded, eager)) <= 1e-5

    # Padding rows wrote nothing, the stale batch's rows were reset.
    _assert_wrote_only_the_batch(batch, before, after_padded, kv, 1e-5)


# -- sampling -----------------------------------------------------------------------------------

def _rows(vocab: int) -> list[SamplingRow]:
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0.8),
              SamplingParams(temperature=1.0, top_k=20, seed=5),
              SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.3),
              SamplingParams(temperature=0, frequency_penalty=0.5, presence_penalty=0.3),
              SamplingParams(temperature=1.2, min_p=0.05, seed=9, frequency_penalty=-0.4)]
    gen = torch.Generator().manual_seed(7)
    return [SamplingRow(p, torch.randint(0, vocab, (30,), generator=gen).tolist(), 12, child_seed(p.seed, i), 30)
            for i, p in enumerate(params)]


def test_sampler_never_writes_the_callers_logits():
    """Penalties work on a copy: an fp32 model's logits (an inference tensor, which cannot be
    written outside inference mode) are reused by the engine for forked children."""
    with torch.inference_mode():
        logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(8))
    original = logits.clone()
    sample(logits, _rows(300), torch.Generator().manual_seed(0))
    assert torch.equal(logits, original)


def test_sampler_greedy_rows_and_seeded_rows_do_not_depend_on_the_batch():
    logits = torch.randn(6, 300, generator=torch.Generator().manual_seed(9))
    rows = _rows(300)
    together = sample(logits, rows, torch.Generator().manual_seed(0))
    rows = _rows(300)
    alone = [sample(logits[i:i + 1], [row], torch.Generator().manual_seed(1))[0] for i, row in enumerate(rows)]
    for i, row in enumerate(rows):
        if row.params.greedy or row.params.seed is not None:
            assert together[i] == alone[i]


@pytest.mark.gpu
@needs_cuda
def test_sampler_synchronises_once_on_cuda():
    logits = torch.randn(6, 32000, device="cuda")
    rows = _rows(32000)
    sample(logits, rows, torch.Generator(device="cuda").manual_seed(0))  # warm-up: lazy CUDA init
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            tokens = sample(logits, rows, torch.Generator(device="cuda").manual_seed(0))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    # The debug mode also warns, once, that it is a prototype: only the operations count.
    syncs = [w for w in caught if "called a synchronizing CUDA operation" in str(w.message)]
    assert len(tokens) == len(rows)
    assert len(syncs) <= 1, [str(w.message) for w in syncs]  # the final .tolist() only


# -- device memory and the benchmark's refusal ---------------------------------------------

def test_device_memory_info_on_cpu():
    info = device_memory_info("cpu")
    assert info.device == "cpu" and info.source == "meminfo"
    assert info.total > 0 and 0 <= info.free <= info.total and info.used == info.total - info.free
    assert info.allocator is None and info.non_torch is None and info.process_used is None


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without CUDA")
def test_bench_gpu_refuses_without_cuda(capsys):
    from evals.bench_gpu import main, run_gpu_bench

    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        run_gpu_bench()
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: tts bench gpu needs a CUDA GPU")


def test_bench_gpu_workload_helpers_on_cpu(generator_model):
    """The benchmark's per-variant calls, on CPU at toy sizes (the GPU run uses them as is)."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from evals.bench_gpu import hf_generate, hf_score, random_prompts, tts_generate, tts_score
    from tts_runtime.engine.request import ScoreParams

    hf = AutoModelForCausalLM.from_config(LlamaConfig(**{**_tiny_llama(), "vocab_size": 49152})).eval()
    prompts = [[p % 49152 for p in prompt] for prompt in random_prompts(2, 6, seed=0)]  # SmolLM2's vocab
    assert hf_generate(hf, prompts, 3) == {"tokens": 6}
    assert hf_score(hf, prompts, 1, last_only=True) == {"tokens": 12}
    assert hf_score(hf, prompts, 2, last_only=False) == {"tokens": 12}
    engine = Engine(generator_model.name, EngineConfig(cache=CacheConfig(num_blocks=8)), loaded=generator_model)
    assert tts_generate(engine, prompts, 3) == {"tokens": 6}
    assert tts_score(engine, prompts, ScoreParams([5], [10, 20]), fused=False) == {"tokens": 12}
    assert engine.executor.ops is EAGER_OPS


def test_bench_gpu_rooflines():
    from evals.bench_gpu import decode_roofline_seconds, prefill_flops_per_token, shape_arch

    arch = shape_arch("llama-3.2-1b")
    layer_params = 16 * (2048 * 64 * (2 * 32 + 2 * 8) + 3 * 2048 * 8192)
    weights = 2 * (layer_params + 128256 * 2048)
    kv_token = 32 * 1024  # DESIGN §11: 32 KiB per token in bf16
    assert arch.kv_bytes_per_token(2) == kv_token
    # Infinitely fast matmuls leave the decode steps' bytes: 3 steps over contexts 11, 12, 13.
    expected = (3 * weights + 2 * (11 + 12 + 13) * kv_token) / 1e12
    assert decode_roofline_seconds(arch, 2, 10, 4, 1e12, float("inf")) == pytest.approx(expected)
    attention = 4 * 16 * 32 * 64 * 512 / 2
    assert prefill_flops_per_token(arch, 511) == pytest.approx(2 * layer_params + attention)


# -- on a GPU --------------------------------------------------------------------------------------

QUESTIONS = [
    "What is the value of $\\sqrt{36 \\times \\sqrt{16}}$?",
    "Solve for x: 3x - 7 = 11.",
    "If f(x) = 2x^2 + 3, what is f(4)?",
    "Tom has 3 times as many marbles as Jerry. Together they have 64 marbles. How many does Tom have?",
    "A rectangle has a perimeter of 30 units and its length is twice its width. What is its area?",
    "Write a short poem about prime numbers.",
]
NEW_TOKENS = 64
# fp32 on the GPU still sums in other orders than HF (Triton attention tiles, fused-norm
# reductions, cuBLAS vs HF's kernels): ~1e-6 relative differences that can flip an argmax at a
# near-tie, after which the continuations legitimately part. A wrong kernel parts early.
MIN_MATCHING_PREFIX = 48


def _matching_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _prompts(loaded) -> list[list[int]]:
    tok = loaded.tokenizer
    if tok.chat_template:
        return [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=True,
                                        add_generation_prompt=True, return_dict=False) for q in QUESTIONS]
    return [tok(f"Question: {q}\nAnswer:")["input_ids"] for q in QUESTIONS]


@pytest.fixture(scope="module")
def cuda_models():
    from tts_runtime.models.loader import load_model

    cache: dict[tuple[str, torch.dtype], object] = {}

    def get(name: str, dtype: torch.dtype = torch.float32):
        key = ("generator" if name == "generator" else "prm", dtype)
        if key not in cache:
            cache[key] = load_model(GENERATOR if name == "generator" else PRM, dtype, torch.device("cuda"))
        return cache[key]

    return get


def _random_cuda_kv(arch, num_blocks: int, block_size: int, dtype: torch.dtype) -> tuple[list, list]:
    """A CUDA KV cache of normal noise (prefixes already cached) and a copy of it."""
    kv = allocate_kv_cache(arch, num_blocks, block_size, dtype, torch.device("cuda"))
    gen = torch.Generator(device="cuda").manual_seed(0)
    for k, v in kv:
        k.normal_(generator=gen)
        v.normal_(generator=gen)
    return kv, [(k.clone(), v.clone()) for k, v in kv]


def _count_graph_runs(engine: Engine, monkeypatch) -> list[int]:
    calls = [0]
    run = engine.executor.graphs.run

    def counted(batch):
        calls[0] += 1
        return run(batch)

    monkeypatch.setattr(engine.executor.graphs, "run", counted)
    return calls


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_decode_matches_eager_decode(cuda_models, monkeypatch):
    loaded = cuda_models("generator")
    prompts = _prompts(loaded)
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    eager = Engine(loaded.name, EngineConfig(device="cuda", cuda_graphs=False), loaded=loaded)
    expected = [o.completions[0].token_ids for o in eager.generate(prompts, greedy)]
    graphs = Engine(loaded.name, EngineConfig(device="cuda"), loaded=loaded)
    assert graphs.executor.graphs is not None and graphs.executor.backend.name == "triton"
    calls = _count_graph_runs(graphs, monkeypatch)
    got = [o.completions[0].token_ids for o in graphs.generate(prompts, greedy)]
    assert calls[0] >= NEW_TOKENS - 2  # every pure-decode step replayed a graph
    # Graph steps pad the batch (other GEMM shapes) and pick key splits from the static table
    # width: fp32 rounding differs slightly from the eager steps, as against HF (see above).
    for want, have in zip(expected, got):
        same = _matching_prefix(want, have)
        assert same == len(want) == len(have) or same >= MIN_MATCHING_PREFIX, (same, want, have)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_step_equals_eager_step_and_keeps_other_kv(cuda_models, dtype):
    """Executor level, one backend (fixed key splits): a batch of exactly a captured size
    replays to the eager logits; a padded batch writes only its own slots."""
    from tts_runtime.executor.cuda_graphs import CudaGraphRunner
    from tts_runtime.executor.attention.triton_attention import TritonAttention

    loaded = cuda_models("generator", dtype)
    model, arch, bs, device = loaded.model, loaded.arch, 16, torch.device("cuda")
    kv, before = _random_cuda_kv(arch, 64, bs, dtype)
    backend = TritonAttention(decode_splits=1)
    runner = CudaGraphRunner(model, kv, backend, EAGER_OPS, max_num_seqs=8, max_blocks_per_seq=8, block_size=bs, sizes=(4, 8))
    tables = [[2 * i, 2 * i + 1, 40 + i] for i in range(8)]
    contexts = [33 + 2 * i for i in range(8)]  # within the three blocks of each table
    vocab = arch.vocab_size
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for n in (8, 5):
        batch = _decode_batch(contexts[:n], tables[:n], bs, 3, device, vocab=vocab, seed=n)
        _restore(kv, before)
        assert runner.can_run(batch)
        graph_logits = runner.run(batch).sample_logits.clone()
        graph_kv = [(k.clone(), v.clone()) for k, v in kv]
        _restore(kv, before)
        eager_logits = LocalExecutor(model, kv, backend).execute(batch).sample_logits
        assert rel_err(graph_logits, eager_logits) <= tol
        _assert_wrote_only_the_batch(batch, before, graph_kv, kv, tol)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_score_graph_forward_equals_eager_and_keeps_other_kv(cuda_models, dtype):
    """Executor level, the demo PRM: a batch of exactly a captured size and a padded one replay
    to the eager scores and write only their own slots."""
    from tts_runtime.executor.attention.triton_attention import TritonAttention
    from tts_runtime.executor.local import compute_output_logits
    from tts_runtime.executor.score_graphs import ScoreGraphRunner

    loaded = cuda_models("prm", dtype)
    model, arch, bs, device = loaded.model, loaded.arch, 16, torch.device("cuda")
    kv, before = _random_cuda_kv(arch, 64, bs, dtype)
    backend = TritonAttention(decode_splits=1)
    runner = ScoreGraphRunner(model, kv, backend, EAGER_OPS, max_tokens=128, max_chunks=4, max_blocks_per_seq=8,
                              block_size=bs, sizes=(64, 128))
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    exact = [(70, 40, [1, 2, 3, 4, 5]), (60, 60, [6, 7, 8, 9]), (90, 28, [10, 11, 12, 13, 14, 15])]
    padded = [(50, 17, [20, 21, 22, 23]), (33, 33, [24, 25, 26])]
    for chunks in (exact, padded, exact):  # the third replays an already captured graph after another
        batch = _score_batch(chunks, bs, 8, device, vocab=arch.vocab_size, seed=len(chunks))
        _restore(kv, before)
        assert runner.can_run(batch)
        with torch.inference_mode():
            graph_scores = [t.clone() for t in compute_output_logits(model, runner.run(batch), batch,
                                                                    EAGER_OPS).score_logits]
        graph_kv = [(k.clone(), v.clone()) for k, v in kv]
        _restore(kv, before)
        eager_scores = LocalExecutor(model, kv, backend).execute(batch).score_logits
        assert max(rel_err(g, e) for g, e in zip(graph_scores, eager_scores)) <= tol
        _assert_wrote_only_the_batch(batch, before, graph_kv, kv, tol)


@pytest.mark.gpu
@needs_cuda
def test_prm_engine_scores_from_score_graphs_as_eager(cuda_models, monkeypatch):
    """Engine level: the PRM's score requests (the second over the first's cached prefix) replay
    score graphs and give the eager engine's scores; the switch off builds no runner."""
    from tts_runtime.engine.request import ScoreParams

    loaded = cuda_models("prm")
    tok = loaded.tokenizer
    question = tok("Question: what is 7 * 8 - 6?\nStep 1: 7 * 8 = 56.\n\n")["input_ids"]
    longer = question + tok("Step 2: 56 - 6 = 50. Answer: 50")["input_ids"][1:]
    candidates = [tok.convert_tokens_to_ids(t) for t in ["▁Yes", "▁No"]]
    requests = [([question], ScoreParams([len(question) - 1], candidates)),
                ([longer, longer[:-3]], ScoreParams([len(question) - 1, len(longer) - 4], candidates))]

    def scores(engine: Engine) -> list[float]:
        return [value for ids, params in requests for out in engine.score(ids, params) for row in out.scores
                for value in row]

    eager = Engine(loaded.name, EngineConfig(device="cuda", score_graphs=False), loaded=loaded)
    assert eager.executor.score_graphs is None
    want = scores(eager)
    graphs = Engine(loaded.name, EngineConfig(device="cuda"), loaded=loaded)
    calls = [0]
    run = graphs.executor.score_graphs.run

    def counted(batch):
        calls[0] += 1
        return run(batch)

    monkeypatch.setattr(graphs.executor.score_graphs, "run", counted)
    got = scores(graphs)
    assert calls[0] >= len(requests)  # every score forward (one per request, or more if split)
    assert torch.tensor(got).sub(torch.tensor(want)).abs().max().item() <= 1e-4


@pytest.mark.gpu
@needs_cuda
def test_executor_sampling_launches_ahead_on_cuda_without_waiting(cuda_models):
    """--executor-sampling on CUDA: the engine launches step N+1 while step N runs, no launch
    synchronises with the device (torch's sync debug mode), and the tokens are the
    engine-sampled run's (up to the rounding of other padded graph sizes, as above)."""
    loaded = cuda_models("generator", torch.bfloat16)
    prompts = _prompts(loaded)
    params = SamplingParams(temperature=0.8, seed=11, max_tokens=NEW_TOKENS, n=2)
    sync = Engine(loaded.name, EngineConfig(device="cuda"), loaded=loaded)
    expected = [[c.token_ids for c in o.completions] for o in sync.generate(prompts, params)]
    engine = Engine(loaded.name, EngineConfig(device="cuda", executor_sampling=True), loaded=loaded)
    assert engine.async_scheduling
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    got: dict[str, list] = {}
    torch.cuda.synchronize()
    while engine.has_unfinished_requests():
        torch.cuda.set_sync_debug_mode("error")
        try:
            engine.launch()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        for out in engine.collect():
            got[out.request_id] = [c.token_ids for c in out.completions]
    while engine.num_in_flight:
        engine.collect()
    assert max(engine.stats.in_flight_at_launch) == 2
    for i, want in enumerate(expected):
        for a, b in zip(want, got[str(i)]):
            same = _matching_prefix(a, b)
            assert same == len(a) == len(b) or same >= MIN_MATCHING_PREFIX, (same, a, b)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("which", ["generator", "prm"])
def test_greedy_parity_with_hf_on_gpu(cuda_models, which):
    from transformers import AutoModelForCausalLM

    loaded = cuda_models(which)
    prompts = _prompts(loaded)
    hf = AutoModelForCausalLM.from_pretrained(loaded.folder, dtype=torch.float32).to("cuda").eval()
    eos = set(loaded.arch.eos_token_ids) | {loaded.tokenizer.eos_token_id}
    expected = []
    for prompt in prompts:
        with torch.no_grad():
            out = hf.generate(torch.tensor([prompt], device="cuda"), attention_mask=torch.ones(1, len(prompt),
                              dtype=torch.long, device="cuda"), max_new_tokens=NEW_TOKENS, do_sample=False)
        ids = out[0, len(prompt):].tolist()
        expected.append(ids[:-1] if ids and ids[-1] in eos else ids)
    del hf
    engine = Engine(loaded.name, EngineConfig(device="cuda", attention_backend="triton"), loaded=loaded)
    got = [o.completions[0].token_ids for o in engine.generate(prompts, SamplingParams(temperature=0,
                                                                                       max_tokens=NEW_TOKENS))]
    for want, have in zip(expected, got):
        same = _matching_prefix(want, have)
        assert same == len(want) == len(have) or same >= MIN_MATCHING_PREFIX, (same, want, have)


@pytest.mark.gpu
@needs_cuda
def test_beam_search_end_to_end_on_gpu(monkeypatch):
    from tts_runtime.runs.datasets import DatasetConfig, load_problems
    from search import SearchConfig, run_search
    from tts_runtime.cohost.runtime import Runtime

    data = shared_data_dir()
    problems = load_problems(DatasetConfig(dataset_path=str(data), limit=10))
    runtime = Runtime(GENERATOR, PRM, engine_config=EngineConfig(device="cuda"))
    # The PRM's score graphs are all captured before the search; the generator captures none.
    scores = runtime.prm.executor.score_graphs
    assert scores.captured_sizes == tuple(sorted(scores.sizes))
    assert runtime.generator.executor.score_graphs.captured_sizes == ()
    calls = _count_graph_runs(runtime.generator, monkeypatch)
    # Five short iterations (the cohost bench's shape): the default forty took over two minutes.
    config = SearchConfig(method="beam", n=4, beam_width=4, num_iterations=5, max_step_tokens=96, problem_batch=10)
    results = run_search(runtime, problems, config)
    assert [r.id for r in results] == [p.id for p in problems]
    assert all(r.beams and r.generated_tokens > 0 and r.prm_tokens > 0 for r in results)
    assert calls[0] > 0  # the generator's decode steps ran from CUDA graphs


@pytest.mark.gpu
@needs_cuda
def test_gpu_memory_info_and_bench_smoke(tmp_path, monkeypatch):
    from evals.bench_gpu import GpuBenchConfig, run_gpu_bench

    info = device_memory_info("cuda")
    assert info.source in ("nvml", "cuda") and info.total > 0 and info.allocator is not None
    assert info.non_torch is not None and info.non_torch >= 0
    monkeypatch.chdir(tmp_path)  # the report goes to ./docs/benchmarks
    tiny = GpuBenchConfig(decode_batches=(4,), decode_contexts=(16,), new_tokens=8, prefill_model="llama-3.2-1b", prefill_requests=4,
                          prefill_batch_tokens=1024, repeats=1, search_limit=0)
    path = run_gpu_bench(tiny, "pytest smoke")
    assert (tmp_path / "docs/benchmarks/gpu.json").is_file() and path.endswith("gpu.md")


def test_gpu_session_refuses_an_unknown_step_and_packs_what_it_ran(tmp_path, monkeypatch, capsys):
    """The prepared lease script: a misspelt step is refused before anything runs; a step
    that fails (no nvidia-smi here) is logged with its exit code and packed."""
    import tarfile

    from evals.gpu_session import main

    monkeypatch.chdir(tmp_path)
    assert main(["--out", str(tmp_path), "--budget", "60", "--steps", "facts", "tests-kernel"]) == 2
    assert "unknown step(s) tests-kernel" in capsys.readouterr().out
    assert not (tmp_path / "gpu_session.tgz").exists()
    assert main(["--out", str(tmp_path), "--budget", "60", "--steps", "facts"]) == 0
    with tarfile.open(tmp_path / "gpu_session.tgz") as archive:
        names = archive.getnames()
    assert "gpu_session/facts.log" in names and "gpu_session/summary.txt" in names
    assert (tmp_path / "runs/gpu_session/summary.txt").read_text().startswith("facts: rc ")


def test_profile_gpu_refuses_without_cuda():
    from evals.profile_gpu import main

    if torch.cuda.is_available():
        pytest.skip("this checks the refusal on a machine without CUDA")
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        main(["--out", "/tmp/never-written"])
