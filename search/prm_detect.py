"""Which PRM format a reward model expects, read from the checkpoint instead of guessed
from its path: a wrong guess scores every step with the wrong question and says nothing.

In order: the embedded stand-ins and dummy shapes are read as judges; a config.json whose
architectures name a reward head says so (Qwen2.5-Math-PRM's `Qwen2ForProcessRewardModel`);
then the known PRM repositories by their Hub name (the id, the folder's name, or the
`_name_or_path` its config.json records). Anything else needs `--prm-format`, as
search-and-learn refuses a PRM it does not know.
"""

from __future__ import annotations

import json
from pathlib import Path

from tts_runtime.config import ConfigError
from tts_runtime.models.registry import ALIASES, resolve

# Hub repository names (without the organisation, lower case) of the PRMs search-and-learn
# and the papers use, with the format each was trained on.
KNOWN_PRMS = {
    "llama3.1-8b-prm-deepseek-data": "rlhflow",
    "llama3.1-8b-prm-mistral-data": "rlhflow",
    "math-shepherd-mistral-7b-prm": "math-shepherd-sal",
    "qwen2.5-math-prm-7b": "qwen-prm",
    "qwen2.5-math-prm-72b": "qwen-prm",
}
# Known PRMs whose head tts cannot read yet: a clear refusal instead of wrong scores.
UNSUPPORTED_PRMS = {
    "skywork-o1-open-prm-qwen-2.5-1.5b": "Skywork's value head",
    "skywork-o1-open-prm-qwen-2.5-7b": "Skywork's value head",
}
REWARD_HEAD_ARCHITECTURES = {"Qwen2ForProcessRewardModel": "qwen-prm"}
FORMAT_CHOICES = "rlhflow, math-shepherd, math-shepherd-sal, qwen-prm or judge (any chat LLM asked yes/no)"


def detect_prm_format(model: str) -> str:
    """The PRM format `model` (an alias, a dummy shape, an HF folder, a GGUF file) expects."""
    if model in ALIASES or model.startswith("dummy:"):
        return "judge"
    found = _by_name(Path(model).name)
    if found is not None:
        return found
    config = _checkpoint_config(model)
    for architecture in config.get("architectures") or []:
        if architecture in REWARD_HEAD_ARCHITECTURES:
            return REWARD_HEAD_ARCHITECTURES[architecture]
    recorded = config.get("_name_or_path")
    found = _by_name(Path(recorded).name) if isinstance(recorded, str) and recorded else None
    if found is not None:
        return found
    raise ConfigError(f"cannot tell which PRM format {model} expects: its checkpoint (architectures "
                      f"{config.get('architectures') or 'unknown'}) is not a PRM tts knows; "
                      f"pass --prm-format {FORMAT_CHOICES}")


def _by_name(name: str) -> str | None:
    key = name.lower().removesuffix(".gguf")
    if key in UNSUPPORTED_PRMS:
        raise ConfigError(f"PRM {name} needs {UNSUPPORTED_PRMS[key]}, which tts does not read yet; "
                          "use another PRM (e.g. RLHFlow/Llama3.1-8B-PRM-Deepseek-Data)")
    return KNOWN_PRMS.get(key)


def _checkpoint_config(model: str) -> dict:
    resolved = resolve(model)
    if resolved.kind != "hf" or resolved.location is None:
        return {}
    try:
        return json.loads((resolved.location / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
