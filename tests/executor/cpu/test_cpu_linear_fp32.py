"""tts's streamed fp32 projections for CPUs with AVX2 and FMA (executor/cpu/cpu_linear_fp32.py)
against F.linear on the real demo models' weights, stored as fp32 and as bf16, in this run's
build and the x86-64-v3 one; what it serves, where `auto` uses it, and the memory profile."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tts_runtime.cpu_features as cpu_features
from tts_runtime.config import EngineConfig
from tts_runtime.executor.cpu.cpu_extensions import KernelUnavailable
from tts_runtime.executor.cpu.cpu_linear_fp32 import StreamedFp32Linear, applies, load_fp32_linear_kernel
from tts_runtime.executor.layer_ops import (PrepackedLinear, layer_ops, onednn_linear, packed_weight_bytes,
                                            resolved_linear_backend)

CPU = torch.device("cpu")

needs_avx2 = pytest.mark.skipif(not applies(), reason="the fp32 kernel needs AVX2 and FMA, which this CPU "
                                                       f"({cpu_features.describe()}) has not")


@pytest.fixture(scope="module", params=[None, "x86-64-v3"], ids=["default-build", "x86-64-v3-build"])
def kernel(request):
    """This run's build and the AVX2 build (x86-64-v3), which any x86-64-v3 CPU runs."""
    if not applies():
        pytest.skip(f"the fp32 kernel needs AVX2 and FMA ({cpu_features.describe()})")
    if request.param is not None and request.param == cpu_features.march():
        pytest.skip(f"the default build is already -march={request.param}")
    try:
        return load_fp32_linear_kernel(request.param)
    except KernelUnavailable as exc:
        pytest.fail(f"the fp32 kernel must build where the CPU has AVX2 and FMA: {exc}")


def _weights(loaded) -> list[torch.Tensor]:
    model = loaded.model
    layer = model.layers[len(model.layers) // 2]
    return [m.weight for m in layer.modules() if isinstance(m, torch.nn.Linear)] + [model.output_weight[:4096]]


@pytest.mark.parametrize("bf16_weights", [False, True], ids=["fp32-stored", "bf16-stored"])
@pytest.mark.parametrize("rows", [1, 3, 4, 16, 33])
def test_kernel_matches_f_linear_on_both_models(kernel, generator_model, prm_model, rows, bf16_weights):
    generator = torch.Generator().manual_seed(rows)
    for loaded in (generator_model, prm_model):
        for weight in _weights(loaded):
            x = torch.randn(rows, weight.shape[1], generator=generator)
            got = kernel.linear(x, kernel.pack_weight(weight, bf16_weights), weight.shape[0])
            # bf16-stored: each weight rounded once to bf16 (relative error <= 2^-9), so the
            # sums stay within the same order of the largest output; fp32: summation order only.
            want = F.linear(x, weight.bfloat16().float() if bf16_weights else weight)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
            if bf16_weights:
                exact = F.linear(x, weight)
                assert (got - exact).abs().max() <= 2 ** -6 * exact.abs().max()


@pytest.mark.parametrize("outputs", [8, 16, 24, 40, 200])  # groups of 3 blocks, and tails of 1 and 2
def test_kernel_handles_partial_groups_and_odd_inputs(kernel, outputs):
    generator = torch.Generator().manual_seed(outputs)
    weight = torch.randn(outputs, 97, generator=generator)
    x = torch.randn(6, 97, generator=generator)
    torch.testing.assert_close(kernel.linear(x, kernel.pack_weight(weight, False), outputs), F.linear(x, weight),
                               rtol=1e-5, atol=1e-4)


@needs_avx2
@pytest.mark.parametrize("rows", [1, 4, 64, 300])
def test_streamed_backend_serves_the_models_fp32_weights_at_any_rows(generator_model, rows):
    model = generator_model.model
    linear = layer_ops(CPU, EngineConfig(linear_backend="streamed"), [model]).linear
    assert isinstance(linear, StreamedFp32Linear) and isinstance(linear.fallback, PrepackedLinear)
    proj = model.layers[0].mlp.down_proj
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, proj.weight.shape[1], generator=generator)
    torch.testing.assert_close(linear(x, proj.weight, None), F.linear(x, proj.weight), rtol=1e-4, atol=1e-4)
    assert list(linear.packed_weight_ids) == [id(proj.weight)]
    cut = model.output_weight[torch.tensor([5, 9, 11, 12, 13, 14, 15, 16])]  # not the model's: the fallback
    flat = torch.randn(rows, cut.shape[1], generator=generator)
    torch.testing.assert_close(linear(flat, cut, None), F.linear(flat, cut), rtol=1e-4, atol=1e-4)
    assert len(linear.packed_weight_ids) == 1


def test_auto_streams_only_on_avx2_cpus_without_avx512(generator_model):
    model = generator_model.model
    linear = layer_ops(CPU, EngineConfig(), [model]).linear
    if applies() and not cpu_features.has("avx512f"):
        assert resolved_linear_backend(CPU, EngineConfig()) == "streamed"
        assert isinstance(linear, StreamedFp32Linear) and linear.fallback is onednn_linear
    else:
        assert linear is onednn_linear


@needs_avx2
def test_stream_copies_are_counted(generator_model):
    model = generator_model.model
    fp32 = sum(m.weight.numel() * 4 for m in model.layers.modules() if isinstance(m, torch.nn.Linear))
    # The kernel takes every projection at any rows, so the stream is the only copy;
    # bf16-stored streams are half.
    assert packed_weight_bytes(model, False, CPU, EngineConfig(linear_backend="streamed")) == fp32
    assert packed_weight_bytes(model, False, CPU, EngineConfig(linear_backend="streamed",
                                                               linear_bf16_weights=True)) == fp32 // 2
    auto = packed_weight_bytes(model, False, CPU, EngineConfig())
    assert auto == (fp32 if resolved_linear_backend(CPU, EngineConfig()) == "streamed" else 0)
