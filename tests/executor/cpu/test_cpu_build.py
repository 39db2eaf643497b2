"""Which CPU features tts sees (tts_runtime/cpu_features.py, TTS_CPU_FEATURES), how the C++
kernels are built and cached for them (executor/cpu/cpu_extensions.py, cpu_build.py), and
that the set-up and a first run print only what they should."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tts_runtime import cpu_features
from tts_runtime.config import resolve_dtype
from tts_runtime.executor.cpu import cpu_extensions
from tts_runtime.executor.cpu.cpu_extensions import KernelUnavailable, build_dir, cflags
from tts_runtime.executor.cpu.cpu_linear import load_linear_kernel

from tests.helpers import REPO_ROOT

SOURCE = cpu_extensions.CSRC / "paged_attention_cpu.cpp"
NEEDS_AVX2 = pytest.mark.skipif(not {"avx2", "fma"} <= cpu_features.native_features(),
                                reason="the x86-64-v3 builds need a CPU with AVX2 and FMA")


def test_avx2_level_hides_avx512_bf16_and_amx_and_builds_for_x86_64_v3(monkeypatch):
    monkeypatch.setenv(cpu_features.ENV, "avx2")
    native = cpu_features.native_features()
    assert cpu_features.features() <= native
    assert not {f for f in cpu_features.features() if f.startswith(("avx512", "amx"))}
    assert cpu_features.has("avx2") == ("avx2" in native) and cpu_features.has("sse4_2") == ("sse4_2" in native)
    assert cpu_features.march() == "x86-64-v3" and "-march=x86-64-v3" in cflags()
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32


def test_the_cache_folder_names_the_instruction_set(monkeypatch):
    monkeypatch.delenv(cpu_features.ENV, raising=False)
    native = build_dir(SOURCE)
    assert cpu_features.isa_key().startswith("native-") and cpu_features.isa_key() in native.name
    monkeypatch.setenv(cpu_features.ENV, "avx2")
    avx2 = build_dir(SOURCE)
    assert "x86-64-v3" in avx2.name and avx2 != native and avx2.parent == native.parent
    assert build_dir(SOURCE, "native") == native  # an explicit -march, whatever the variable says
    monkeypatch.setenv(cpu_features.ENV, "avx512")
    assert "x86-64-v4" in build_dir(SOURCE).name


def test_native_key_changes_with_the_cpus_instruction_set(monkeypatch):
    monkeypatch.delenv(cpu_features.ENV, raising=False)
    key = cpu_features.isa_key()
    flags = cpu_features.native_features()
    other = flags - {"avx512f", "avx512bw", "avx512_bf16"} if "avx512f" in flags else flags | {"avx512f"}
    monkeypatch.setattr(cpu_features, "native_features", lambda: other)
    assert cpu_features.isa_key() != key
    monkeypatch.setattr(cpu_features, "native_features", lambda: flags | {"hypervisor", "constant_tsc"})
    assert cpu_features.isa_key() == key  # flags that are no instruction set change nothing


def test_an_unknown_level_is_one_clear_error(monkeypatch):
    monkeypatch.setenv(cpu_features.ENV, "avx9")
    with pytest.raises(cpu_features.CpuFeaturesError, match="choose native, avx2, avx512"):
        cpu_features.has("avx2")


def test_the_streamed_kernel_is_not_built_without_avx512_bf16(monkeypatch):
    monkeypatch.setenv(cpu_features.ENV, "avx2")
    with pytest.raises(KernelUnavailable, match=r"needs AVX512-BF16.*TTS_CPU_FEATURES=avx2"):
        load_linear_kernel.__wrapped__()


@NEEDS_AVX2
def test_the_streamed_kernels_x86_64_v3_build_reports_no_kernel():
    with pytest.raises(KernelUnavailable, match="x86-64-v3, which has no AVX512-BF16"):
        load_linear_kernel("x86-64-v3")


@NEEDS_AVX2
def test_set_up_prints_one_line_per_kernel_and_a_skip_line_without_a_traceback():
    env = {**os.environ, cpu_features.ENV: "avx2", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-m", "tts_runtime.executor.cpu.cpu_build"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stderr == "", done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "streamed linear kernel: skipped, needs AVX512-BF16" in lines
    assert any(line.startswith("paged attention kernel: ready (") and "-march=x86-64-v3" in line for line in lines)
    assert any(line.startswith("layer ops: ready (") for line in lines)
    assert any(line.startswith("streamed fp32 linear kernel: ready (") for line in lines)
    assert lines[-1].startswith("CPU kernels: ") and len(lines) == 5


def test_the_cpu_memory_profile_prints_no_profiler_lines():
    # Kineto writes "USDT:... profiler_start/stop" to stderr from C++; the first run of the
    # demo showed them. Whatever else reaches stderr during the profile still does.
    script = ("import sys, torch\n"
              "from memory.profile import measure_forward\n"
              "def forward():\n"
              "    torch.randn(256, 256) @ torch.randn(256, 256)\n"
              "    print('kept', file=sys.stderr)\n"
              "print(measure_forward(forward, torch.device('cpu'))[0])\n")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) > 0 and done.stderr == "kept\n"


def test_a_lock_left_by_a_killed_build_does_not_stall_the_next_one():
    """Ctrl-C during `make setup` leaves torch's build lock file behind; the next load must not
    wait on it forever (it used to: the test's timeout was the only way out)."""
    from tts_runtime.executor.cpu.cpu_layer_ops import load_layer_ops_kernel

    load_layer_ops_kernel()  # built (or loaded from the cache) once, so the second load is quick
    folder = build_dir(cpu_extensions.CSRC / "layer_ops_cpu.cpp")
    (folder / "lock").touch()  # what a killed build leaves
    code = ("from tts_runtime.executor.cpu.cpu_layer_ops import load_layer_ops_kernel\n"
            "load_layer_ops_kernel()\nprint('loaded')\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "loaded", done.stderr[-2000:]
    assert not (folder / "lock").exists()
