"""Models named by their Hugging Face Hub id, resolved through huggingface_hub's cache: a
cache laid out on disk by the test (the real `models--org--name/refs`, `snapshots/<commit>/`
layout) holding the demo generator's files, read with HF_HUB_OFFLINE=1 in a fresh process
(huggingface_hub reads its environment once, at import)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _lay_out_cache(hub: Path, repo_id: str, source: Path) -> Path:
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    for item in source.iterdir():
        if item.is_file():
            shutil.copy(item, snapshot / item.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return snapshot


def _in_fresh_process(code: str, hub: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)


def test_a_hub_id_loads_from_the_cache_and_an_unknown_one_is_one_line(tmp_path, generator_model):
    snapshot = _lay_out_cache(tmp_path / "hub", "demo-org/SmolLM2-135M-Instruct", generator_model.folder)
    loaded = _in_fresh_process(
        "import torch\n"
        "from tts_runtime.models.loader import load_model\n"
        "for name in ('demo-org/SmolLM2-135M-Instruct', 'demo-org/SmolLM2-135M-Instruct@" + COMMIT + "'):\n"
        "    m = load_model(name, torch.float32, torch.device('cpu'))\n"
        "    print(m.folder, m.arch.num_layers, m.tokenizer('2+2=4')['input_ids'])\n", tmp_path / "hub")
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    expected = f"{snapshot} 30 {generator_model.tokenizer('2+2=4')['input_ids']}"
    assert loaded.stdout.splitlines() == [expected, expected]

    missing = _in_fresh_process(
        "from tts_runtime.models.registry import resolve\n"
        "from tts_runtime.config import ConfigError\n"
        "try:\n    resolve('demo-org/not-downloaded')\nexcept ConfigError as exc:\n    print(exc)\n", tmp_path / "hub")
    assert missing.returncode == 0, missing.stderr[-2000:]
    [line] = missing.stdout.splitlines()
    assert line.startswith("model demo-org/not-downloaded is not in the Hugging Face cache and the Hub cannot "
                           "be reached")


def test_generation_config_end_of_sequence_ids_stop_generation(tmp_path, generator_model):
    """Ids that only generation_config.json lists end a generation, as vLLM's stop does."""
    import json

    import torch

    from tts_runtime.config import EngineConfig
    from tts_runtime.engine.engine import Engine
    from tts_runtime.engine.request import SamplingParams
    from tts_runtime.models.loader import load_model

    prompt = generator_model.tokenizer("The capital of France is")["input_ids"]
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    first = Engine(generator_model.name, EngineConfig(device="cpu"), loaded=generator_model) \
        .generate([prompt], greedy)[0].completions[0].token_ids
    folder = tmp_path / "with-generation-config"
    shutil.copytree(generator_model.folder, folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [first[2]]}))
    loaded = load_model(str(folder), torch.float32, torch.device("cpu"))
    assert first[2] in loaded.arch.eos_token_ids and set(generator_model.arch.eos_token_ids) <= set(
        loaded.arch.eos_token_ids)
    stopped = Engine(loaded.name, EngineConfig(device="cpu"), loaded=loaded) \
        .generate([prompt], greedy)[0].completions[0]
    assert first[2] not in first[:2]
    assert stopped.token_ids == first[:2] and stopped.finish_reason == "eos"  # the id itself is not output


def test_revision_is_the_same_as_at_revision(tmp_path, generator_model):
    """ModelSpec.revision pins a Hub id as `org/name@revision` does; both given and different,
    or given for a local model, is a one-line error."""
    snapshot = _lay_out_cache(tmp_path / "hub", "demo-org/SmolLM2-135M-Instruct", generator_model.folder)
    code = (
        "import torch\n"
        "from tts_runtime.config import ConfigError, ModelSpec\n"
        "from tts_runtime.models.loader import load_model\n"
        "from tts_runtime.models.registry import resolve\n"
        "spec = ModelSpec('demo-org/SmolLM2-135M-Instruct', revision='" + COMMIT + "')\n"
        "print(spec.model)\n"
        "print(load_model(spec.model, torch.float32, torch.device('cpu')).folder)\n"
        "print(ModelSpec('demo-org/SmolLM2-135M-Instruct@main', revision='main').model)\n"
        "for make in (lambda: ModelSpec('demo-org/SmolLM2-135M-Instruct@main', revision='v2'),\n"
        "             lambda: resolve(ModelSpec('smollm2-135m-instruct', revision='main').model),\n"
        "             lambda: resolve(ModelSpec('demo-org/SmolLM2-135M-Instruct', revision='v2').model)):\n"
        "    try:\n        make()\n        print('no error')\n"
        "    except ConfigError as exc:\n        print(exc)\n")
    done = _in_fresh_process(code, tmp_path / "hub")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[:3] == [f"demo-org/SmolLM2-135M-Instruct@{COMMIT}", str(snapshot),
                         "demo-org/SmolLM2-135M-Instruct@main"]
    assert lines[3] == ("model demo-org/SmolLM2-135M-Instruct@main pins revision 'main' but --revision is 'v2'; "
                        "give the revision once")
    assert lines[4].startswith("model 'smollm2-135m-instruct@main': a revision (@... or --revision) applies to "
                               "Hugging Face Hub ids only")
    assert lines[5].startswith("model demo-org/SmolLM2-135M-Instruct@v2 is not in the Hugging Face cache")
    assert len(lines) == 6
