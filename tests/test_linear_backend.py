"""The CPU projections on oneDNN (the default) give the torch path's greedy tokens and
scores on the real demo models; the switch is validated."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tts_runtime import Engine, EngineConfig, SamplingParams, ScoreParams
from tts_runtime.config import ConfigError
from tts_runtime.executor.layer_ops import layer_ops, onednn_linear

from tests.test_engine_parity import _prompts


def test_auto_puts_the_cpu_projections_on_onednn():
    cpu = torch.device("cpu")
    assert layer_ops(cpu, EngineConfig()).linear is onednn_linear
    assert layer_ops(cpu, EngineConfig(linear_backend="onednn")).linear is onednn_linear
    assert layer_ops(cpu, EngineConfig(linear_backend="torch")).linear is F.linear


def test_unknown_linear_backend_is_refused():
    with pytest.raises(ConfigError, match="unknown --linear-backend 'mkl'; choose one of auto, onednn, torch"):
        EngineConfig(linear_backend="mkl")


def test_onednn_matches_torch_on_real_weights_fp32_and_bf16(generator_model):
    mlp = generator_model.model.layers[3].mlp
    x = torch.randn(16, generator_model.arch.hidden_size, generator=torch.Generator().manual_seed(0))
    for dtype, tolerance in ((torch.float32, 1e-4), (torch.bfloat16, 0.0)):
        w, h = mlp.gate_up_proj.weight.to(dtype), x.to(dtype)
        got, want = onednn_linear(h, w, None).float(), F.linear(h, w).float()
        assert got.shape == (16, w.shape[0])
        assert (got - want).abs().max().item() <= tolerance * want.abs().max().item()


def test_greedy_tokens_and_scores_equal_the_torch_path(generator_model, prm_model):
    prompts = _prompts(generator_model)
    greedy = SamplingParams(temperature=0, max_tokens=48)
    tokens = {}
    for backend in ("torch", "onednn"):
        engine = Engine(generator_model.name, EngineConfig(linear_backend=backend), loaded=generator_model)
        tokens[backend] = [o.completions[0].token_ids for o in engine.generate(prompts, greedy)]
    assert tokens["onednn"] == tokens["torch"]

    tok = prm_model.tokenizer
    ids = tok("Question: what is 7 * 8 - 6?\nStep 1: 7 * 8 = 56.\nStep 2: 56 - 6 = 50. Correct? Answer:")["input_ids"]
    params = ScoreParams([len(ids) // 2, len(ids) - 1], [tok.convert_tokens_to_ids(t) for t in ["▁Yes", "▁No"]])
    scores = {backend: torch.tensor(Engine(prm_model.name, EngineConfig(linear_backend=backend),
                                           loaded=prm_model).score([ids], params)[0].scores)
              for backend in ("torch", "onednn")}
    assert (scores["onednn"] - scores["torch"]).abs().max().item() <= 1e-5
