"""The CPU projections on oneDNN, on plain weights (the default) or prepacked ones, give the
torch path's greedy tokens and scores on the real demo models; packed copies are counted in
the memory profile; the switch is validated."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tts_runtime import Engine, EngineConfig, SamplingParams, ScoreParams, cpu_features
from tts_runtime.config import ConfigError
from tts_runtime.executor.layer_ops import (PrepackedLinear, layer_ops, onednn_linear, packed_weight_bytes,
                                            resolved_linear_backend)
from tts_runtime.cohost.runtime import profile_one

from tests.helpers import question_prompts


def test_auto_puts_the_cpu_projections_on_onednn(generator_model):
    cpu, models = torch.device("cpu"), [generator_model.model]
    # On CPUs with AVX2 but no AVX-512, `auto` streams fp32 weights (tests/executor/cpu/test_cpu_linear_fp32.py).
    if resolved_linear_backend(cpu, EngineConfig()) == "onednn":
        assert layer_ops(cpu, EngineConfig(), models).linear is onednn_linear
    assert isinstance(layer_ops(cpu, EngineConfig(linear_backend="prepacked"), models).linear, PrepackedLinear)
    assert layer_ops(cpu, EngineConfig(linear_backend="torch"), models).linear is F.linear


def test_unknown_linear_backend_is_refused():
    with pytest.raises(ConfigError, match="unknown --linear-backend 'mkl'; choose one of auto, streamed, prepacked, onednn, "
                                          "torch"):
        EngineConfig(linear_backend="mkl")


def test_onednn_matches_torch_on_real_weights_fp32_and_bf16(generator_model):
    mlp = generator_model.model.layers[3].mlp
    x = torch.randn(16, generator_model.arch.hidden_size, generator=torch.Generator().manual_seed(0))
    # bf16: with AVX512-BF16 both sides are oneDNN's one bf16 kernel, bit for bit; without it
    # F.linear and oneDNN take different fp32 paths that may differ by one bf16 rounding.
    bf16_tolerance = 0.0 if cpu_features.has("avx512_bf16") else 2 ** -7
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, bf16_tolerance)):
        w, h = mlp.gate_up_proj.weight.to(dtype), x.to(dtype)
        got, want = onednn_linear(h, w, None).float(), F.linear(h, w).float()
        assert got.shape == (16, w.shape[0])
        assert (got - want).abs().max().item() <= tolerance * want.abs().max().item()


def test_prepacked_weights_match_plain_ones_and_only_the_models_own_are_packed(generator_model):
    model = generator_model.model
    packed = PrepackedLinear([model])
    proj = model.layers[0].self_attn.qkv_proj
    x = torch.randn(5, generator_model.arch.hidden_size, generator=torch.Generator().manual_seed(1))
    want = F.linear(x, proj.weight, proj.bias)
    for _ in range(2):  # the first call packs, the second reuses the packed copy
        got = packed(x, proj.weight, proj.bias)
        assert (got - want).abs().max().item() <= 1e-4 * want.abs().max().item()
    assert len(packed.packed_weight_ids) == 1
    rows = model.output_weight[torch.tensor([5, 9, 11])]  # a PRM's candidate columns: a new tensor per call
    assert torch.allclose(packed(x, rows, None), F.linear(x, rows), rtol=1e-4, atol=1e-5)
    assert len(packed.packed_weight_ids) == 1


def test_packed_copies_are_counted_in_the_memory_profile(generator_model):
    model, cpu = generator_model.model, torch.device("cpu")
    projections = sum(m.weight.numel() * 4 for m in model.layers.modules() if isinstance(m, torch.nn.Linear))
    head = model.output_weight.numel() * 4
    prepacked = EngineConfig(linear_backend="prepacked")
    assert packed_weight_bytes(model, True, cpu, prepacked) == projections + head
    assert packed_weight_bytes(model, False, cpu, prepacked) == projections
    # `auto` packs nothing where it means oneDNN (on AVX2-only CPUs: tests/executor/cpu/test_cpu_linear_fp32.py).
    if resolved_linear_backend(cpu, EngineConfig()) == "onednn":
        assert packed_weight_bytes(model, True, cpu, EngineConfig()) == 0
    plain = profile_one(generator_model, "generate", EngineConfig(linear_backend="onednn"))
    prepacked = profile_one(generator_model, "generate", EngineConfig(linear_backend="prepacked"))
    assert prepacked.weights_bytes - plain.weights_bytes == projections + head


def test_greedy_tokens_and_scores_equal_the_torch_path(generator_model, prm_model):
    prompts = question_prompts(generator_model)
    greedy = SamplingParams(temperature=0, max_tokens=48)
    tokens = {}
    for backend in ("torch", "onednn", "prepacked"):
        engine = Engine(generator_model.name, EngineConfig(linear_backend=backend), loaded=generator_model)
        tokens[backend] = [o.completions[0].token_ids for o in engine.generate(prompts, greedy)]
    assert tokens["onednn"] == tokens["torch"] == tokens["prepacked"]

    tok = prm_model.tokenizer
    ids = tok("Question: what is 7 * 8 - 6?\nStep 1: 7 * 8 = 56.\nStep 2: 56 - 6 = 50. Correct? Answer:")["input_ids"]
    params = ScoreParams([len(ids) // 2, len(ids) - 1], [tok.convert_tokens_to_ids(t) for t in ["▁Yes", "▁No"]])
    scores = {backend: torch.tensor(Engine(prm_model.name, EngineConfig(linear_backend=backend),
                                           loaded=prm_model).score([ids], params)[0].scores)
              for backend in ("torch", "onednn", "prepacked")}
    assert (scores["onednn"] - scores["torch"]).abs().max().item() <= 1e-5
    assert (scores["prepacked"] - scores["torch"]).abs().max().item() <= 1e-5
