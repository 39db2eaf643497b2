"""tts's streamed bf16 projections (`--linear-backend streamed`, executor/cpu/cpu_linear.py)
against F.linear on the real demo models' weights, at the row counts a decode step, a short
prefill and a long one use, and on shapes whose outputs leave partial groups; whole bf16
models as close to their fp32 selves as on oneDNN; fallbacks and the memory profile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tts_runtime import Engine, EngineConfig, ScoreParams, cpu_features
from tts_runtime.executor.cpu.cpu_extensions import KernelUnavailable
from tts_runtime.executor.layer_ops import (PrepackedLinear, layer_ops, onednn_linear, packed_weight_bytes,
                                            resolved_linear_backend)
from tts_runtime.models.loader import load_model

from tests.helpers import GENERATOR, PRM, question_prompts

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def kernel():
    from tts_runtime.executor.cpu.cpu_linear import load_linear_kernel

    try:
        return load_linear_kernel()
    except KernelUnavailable as exc:  # a CPU without AVX512-BF16: the backend falls back to oneDNN
        pytest.skip(f"streamed linear kernel unavailable here: {exc}")


@pytest.fixture(scope="module")
def bf16_generator():
    return load_model(GENERATOR, torch.bfloat16, CPU)


@pytest.fixture(scope="module")
def bf16_prm():
    return load_model(PRM, torch.bfloat16, CPU)


def _close_to_f_linear(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    want = F.linear(x, weight)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    # Both sum in fp32 and round once; only the summation order may differ.
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-2 * want.abs().max().item())


@pytest.mark.parametrize("rows", [1, 3, 16, 40, 300])
def test_kernel_matches_f_linear_on_every_projection(kernel, bf16_generator, rows):
    model = bf16_generator.model
    layer = model.layers[7]
    weights = [layer.self_attn.qkv_proj.weight, layer.self_attn.o_proj.weight, layer.mlp.gate_up_proj.weight,
               layer.mlp.down_proj.weight, model.output_weight]
    generator = torch.Generator().manual_seed(rows)
    for weight in weights:
        x = torch.randn(rows, weight.shape[1], generator=generator).bfloat16()
        _close_to_f_linear(kernel.linear(x, kernel.pack_weight(weight), weight.shape[0]), x, weight)


@pytest.mark.parametrize("outputs", [16, 32, 48, 80, 640])  # groups of 3 blocks, and tails of 1 and 2
def test_kernel_handles_partial_groups(kernel, outputs):
    generator = torch.Generator().manual_seed(outputs)
    weight = torch.randn(outputs, 98, generator=generator).bfloat16()
    x = torch.randn(11, 98, generator=generator).bfloat16()
    _close_to_f_linear(kernel.linear(x, kernel.pack_weight(weight), outputs), x, weight)


def test_backend_packs_the_models_own_bf16_weights_once_and_passes_the_rest_on(kernel, bf16_generator):
    from tts_runtime.executor.cpu.cpu_linear import StreamedBf16Linear

    model = bf16_generator.model
    linear = layer_ops(CPU, EngineConfig(linear_backend="streamed"), [model]).linear
    assert isinstance(linear, StreamedBf16Linear)
    proj = model.layers[0].mlp.down_proj
    # Two rows: within the kernel's row limit on every CPU.
    x = torch.randn(2, 1, proj.weight.shape[1], generator=torch.Generator().manual_seed(3)).bfloat16()
    for _ in range(2):  # the first call packs, the second reuses the packed copy
        got = linear(x, proj.weight, None)
        assert got.shape == (2, 1, proj.weight.shape[0])
        _close_to_f_linear(got.view(2, -1), x.view(2, -1), proj.weight)
    assert len(linear.packed_weight_ids) == 1
    rows = model.output_weight[torch.tensor([5, 9, 11])]  # a PRM's candidate columns: oneDNN
    hidden = torch.randn(6, rows.shape[1], generator=torch.Generator().manual_seed(5)).bfloat16()
    torch.testing.assert_close(linear(hidden, rows, None), F.linear(hidden, rows))
    assert len(linear.packed_weight_ids) == 1


def test_calls_above_the_row_limit_go_to_onednn(kernel, bf16_generator):
    """On AMX CPUs oneDNN's tiles beat the kernel beyond a few rows: a limited backend packs
    for the small calls and hands the large ones to its fallback unchanged."""
    from tts_runtime.executor.cpu.cpu_linear import AMX_MAX_ROWS, StreamedBf16Linear, row_limit

    model = bf16_generator.model
    fallback = PrepackedLinear([model])
    linear = StreamedBf16Linear(kernel, [model], fallback, max_rows=2)
    proj = model.layers[0].mlp.gate_up_proj
    generator = torch.Generator().manual_seed(6)
    wide = torch.randn(16, proj.weight.shape[1], generator=generator).bfloat16()
    torch.testing.assert_close(linear(wide, proj.weight, None), fallback(wide, proj.weight, None), rtol=0, atol=0)
    assert not linear.packed_weight_ids
    narrow = torch.randn(1, 2, proj.weight.shape[1], generator=generator).bfloat16()
    _close_to_f_linear(linear(narrow, proj.weight, None).view(2, -1), narrow.view(2, -1), proj.weight)
    assert len(linear.packed_weight_ids) == 1
    assert row_limit() == (AMX_MAX_ROWS if cpu_features.has("amx_tile") else None)


def test_fp32_models_go_to_the_fp32_kernel_or_prepacked(generator_model):
    from tts_runtime.executor.cpu.cpu_linear import StreamedBf16Linear
    from tts_runtime.executor.cpu.cpu_linear_fp32 import StreamedFp32Linear

    linear = layer_ops(CPU, EngineConfig(linear_backend="streamed"), [generator_model.model]).linear
    proj = generator_model.model.layers[0].self_attn.qkv_proj
    x = torch.randn(4, proj.weight.shape[1], generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(linear(x, proj.weight, None), F.linear(x, proj.weight), rtol=1e-4, atol=1e-4)
    # fp32: the bf16 kernel is not even loaded (the model has no bf16 weight); the AVX2/FMA
    # kernel (test_cpu_linear_fp32.py) takes it where the CPU has AVX2, else oneDNN's copy.
    assert not isinstance(linear, StreamedBf16Linear)
    assert isinstance(linear, (StreamedFp32Linear, PrepackedLinear))
    assert linear.packed_weight_ids == (id(proj.weight),)


def test_streamed_copies_are_counted_like_prepacked_ones(bf16_generator):
    model = bf16_generator.model
    projections = sum(m.weight.numel() * 2 for m in model.layers.modules() if isinstance(m, torch.nn.Linear))
    streamed = EngineConfig(linear_backend="streamed")
    assert packed_weight_bytes(model, True, CPU, streamed) == projections + model.output_weight.numel() * 2
    assert packed_weight_bytes(model, False, CPU, streamed) == projections



def test_auto_streams_bf16_models_where_the_cpu_has_avx512_bf16(bf16_generator):
    """`auto` is the fastest path this CPU has: tts's kernel for bf16 weights with
    AVX512-BF16 (1.41x oneDNN on a search-and-learn-shaped search), beside the plain
    weight (oneDNN serves what the kernel does not take); oneDNN elsewhere."""
    from tts_runtime.executor.cpu.cpu_linear import StreamedBf16Linear

    model = bf16_generator.model
    linear = layer_ops(CPU, EngineConfig(), [model]).linear
    projections = sum(m.weight.numel() * 2 for m in model.layers.modules() if isinstance(m, torch.nn.Linear))
    if not cpu_features.has("avx512_bf16"):
        assert resolved_linear_backend(CPU, EngineConfig(), torch.bfloat16) == "onednn"
        assert linear is onednn_linear and packed_weight_bytes(model, True, CPU, EngineConfig()) == 0
        return
    assert resolved_linear_backend(CPU, EngineConfig(), torch.bfloat16) == "streamed"
    assert isinstance(linear, StreamedBf16Linear) and linear.fallback is onednn_linear
    assert packed_weight_bytes(model, True, CPU, EngineConfig()) == projections + model.output_weight.numel() * 2
    proj = model.layers[0].mlp.down_proj
    x = torch.randn(5, proj.weight.shape[1], generator=torch.Generator().manual_seed(5)).bfloat16()
    _close_to_f_linear(linear(x, proj.weight, None), x, proj.weight)
    assert id(proj.weight) in linear.packed_weight_ids

def _candidate_scores(loaded, backend: str, prompts: list[list[int]]) -> torch.Tensor:
    """The engine's next-token distribution over a few candidates at every prompt position."""
    engine = Engine(loaded.name, EngineConfig(linear_backend=backend), loaded=loaded)
    candidates = [1348, 504, 62, 2068, 788, 24960, 216, 28]
    return torch.cat([torch.tensor(engine.score([p], ScoreParams(list(range(1, len(p))), candidates))[0].scores)
                      .flatten() for p in prompts])


@pytest.mark.parametrize("role", ["generator", "prm"])
def test_whole_models_in_bf16_are_as_close_to_fp32_as_onednn(kernel, role, request):
    # In bf16 the kernel's sums differ from oneDNN's in order only, so greedy paths part at
    # the first near-tie (one of these prompts has one at its first token): compare each bf16
    # backend's distance from the fp32 model instead.
    fp32 = request.getfixturevalue(f"{role}_model")
    bf16 = request.getfixturevalue(f"bf16_{role}")
    prompts = question_prompts(bf16)
    reference = _candidate_scores(fp32, "onednn", prompts)
    error = {backend: (_candidate_scores(bf16, backend, prompts) - reference).abs()
             for backend in ("onednn", "streamed")}
    assert error["streamed"].mean() <= 1.25 * error["onednn"].mean()
    assert error["streamed"].max() <= 1.5 * error["onednn"].max()
