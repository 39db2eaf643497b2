"""The C++ layer ops (executor/cpu/cpu_layer_ops.py) against torch's eager ops, on the arguments
the real demo models pass them while generating for a real MATH-500 problem."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from tts_runtime import Engine, EngineConfig, SamplingParams, cpu_features
from tts_runtime.executor.cpu.cpu_extensions import KernelUnavailable
from tts_runtime.executor.cpu.cpu_layer_ops import cpu_layer_ops, load_layer_ops_kernel
from tts_runtime.executor.layer_ops import layer_ops
from tts_runtime.models import layers


@pytest.fixture(scope="module", params=[None, "x86-64-v3"], ids=["default-build", "x86-64-v3-build"])
def fused(request) -> layers.LayerOps:
    """The layer ops of this run's build (native, or what TTS_CPU_FEATURES names) and of the
    AVX2 build (x86-64-v3), which any x86-64-v3 CPU runs, this one included."""
    if request.param is not None and request.param == cpu_features.march():
        pytest.skip(f"the default build is already -march={request.param} ({cpu_features.ENV}={cpu_features.level()})")
    try:
        return cpu_layer_ops(load_layer_ops_kernel(request.param))
    except KernelUnavailable as exc:
        pytest.fail(f"the CPU layer ops must build where the tests run: {exc}")


def _recorded_calls(loaded, math500_path) -> list[tuple[str, tuple]]:
    """Every elementwise op call (name, cloned arguments) of a 1-token prefill and 3 decode
    steps of `loaded` on the first MATH-500 problem, run on the eager ops."""
    calls: list[tuple[str, tuple]] = []

    def record(name, fn):
        def wrapped(*args):
            calls.append((name, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)))
            return fn(*args)
        return wrapped

    engine = Engine(loaded.name, EngineConfig(cpu_fused_ops=False, linear_backend="torch"), loaded=loaded)
    eager = engine.executor.ops
    engine.executor.ops = replace(eager, rms_norm=record("rms_norm", eager.rms_norm),
                                  rotary_qk=record("rotary_qk", eager.rotary_qk),
                                  act_and_mul=record("act_and_mul", eager.act_and_mul))
    problem = json.loads(math500_path.read_text().splitlines()[0])["problem"]
    engine.generate([loaded.tokenizer.encode(problem)], SamplingParams(temperature=0, max_tokens=4))
    return calls


def _as(dtype: torch.dtype, args: tuple) -> tuple:
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def _view_of_projection(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k as the attention layer passes them: strided views of one projection output."""
    qkv = torch.cat([q.flatten(1), k.flatten(1), torch.zeros_like(k.flatten(1))], dim=1)
    q_size = q[0].numel()
    return (qkv[:, :q_size].view(q.shape), qkv[:, q_size: q_size + k[0].numel()].view(k.shape))


@pytest.mark.parametrize("model", ["generator", "prm"])
def test_layer_ops_match_eager_on_real_activations(fused, model, generator_model, prm_model, math500_path):
    loaded = generator_model if model == "generator" else prm_model
    calls = _recorded_calls(loaded, math500_path)
    seen = {name for name, _ in calls}
    assert seen == {"rms_norm", "rotary_qk", "act_and_mul"}
    for name, args in calls:
        for dtype in (torch.float32, torch.bfloat16):
            typed = _as(dtype, args)
            if name == "rotary_qk":
                q, k, cos, sin = typed
                want = layers.rotary_qk(q, k, cos, sin)
                got = fused.rotary_qk(*_view_of_projection(q, k), cos, sin)
                # The eager op's roundings, reproduced: bit-exact in both dtypes.
                assert all(torch.equal(g, w) for g, w in zip(got, want)), (model, dtype)
                continue
            want = getattr(layers, name)(*typed)
            got = getattr(fused, name)(*typed)
            assert got.dtype == want.dtype and got.shape == want.shape
            if dtype == torch.float32:
                torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-6)
            else:  # fp32 summation order and exp: a bf16 step or two (the Llama norm's weight
                # times a row that moved by one), rarely, and noise far below the tensor's scale
                # where tanh-GELU cancels (1 + tanh of a very negative input, inexact in both)
                scale = want.float().abs().max().item()
                torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -6, atol=1e-5 * scale)
                assert (got != want).float().mean().item() < 0.05, (model, name)


def test_per_head_gemma_norm_on_strided_heads(fused, prm_model):
    """Gemma's q/k norms take [tokens, heads, head_dim] views of the projection output."""
    torch.manual_seed(0)
    weight = prm_model.model.layers[0].self_attn.q_norm.weight.detach()
    heads, dim = 4, weight.numel()
    qkv = torch.randn(5, heads * dim + 2 * dim)
    q = qkv[:, : heads * dim].view(5, heads, dim)
    assert not q.is_contiguous()
    torch.testing.assert_close(fused.rms_norm(q, weight, 1e-6, True), layers.rms_norm(q, weight, 1e-6, True),
                               rtol=2e-6, atol=1e-6)


def test_inputs_the_kernels_do_not_take_go_to_the_eager_ops(fused):
    torch.manual_seed(0)
    x = torch.randn(3, 64, dtype=torch.float16)
    w = torch.randn(64, dtype=torch.float16)
    assert torch.equal(fused.rms_norm(x, w, 1e-5, False), layers.rms_norm(x, w, 1e-5, False))
    gate_up = torch.randn(3, 128)
    assert torch.equal(fused.act_and_mul(gate_up, "gelu"), layers.act_and_mul(gate_up, "gelu"))


def test_engine_switch_picks_the_ops(generator_model):
    on = layer_ops(torch.device("cpu"), EngineConfig(linear_backend="torch"), [generator_model.model])
    off = layer_ops(torch.device("cpu"), EngineConfig(linear_backend="torch", cpu_fused_ops=False),
                    [generator_model.model])
    assert on.rms_norm is not layers.rms_norm and on.act_and_mul is not layers.act_and_mul
    assert off == layers.EAGER_OPS
