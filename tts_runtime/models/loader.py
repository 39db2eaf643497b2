"""Weight loading: HF safetensors folders, GGUF files, and dummy random weights.

A GGUF file is dequantized once (transformers' GGUF conversion, built on the `gguf`
package: it knows every tensor-name mapping and llama.cpp's Q/K permutation) and cached
as an HF folder of safetensors + config + tokenizer, so the next load takes seconds and
the HF parity reference reads exactly the same weights.
"""

from __future__ import annotations

import json
import zlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tts_runtime.config import ConfigError
from tts_runtime.models.arch import ArchConfig, arch_from_hf
from tts_runtime.models.decoder import DecoderModel, ModelPart
from tts_runtime.models.registry import resolve
from tts_runtime.paths import cache_root  # noqa: F401 (also imported from here)


def _gguf_cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    return cache_root() / "gguf" / f"{gguf.stem}-{stat.st_size}"


def convert_gguf(gguf: Path) -> Path:
    """Dequantize a GGUF file into an HF folder (once) and return the folder."""
    target = _gguf_cache_dir(gguf)
    if (target / "model.safetensors").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tmp.mkdir(parents=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the cached copy is plain dequantized weights
    state = model.state_dict()
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tokenizer.save_pretrained(tmp)
    # Rename last so a killed conversion never leaves a half-written cache behind.
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def model_folder(name: str) -> Path | None:
    """The HF folder a model name loads from (None for dummy weights)."""
    resolved = resolve(name)
    if resolved.kind == "gguf":
        return convert_gguf(resolved.location)
    return resolved.location


@dataclass
class LoadedModel:
    name: str
    arch: ArchConfig
    model: DecoderModel
    tokenizer: object | None  # a transformers tokenizer; None for dummy weights
    folder: Path | None

    @property
    def dtype(self) -> torch.dtype:
        return self.model.output_weight.dtype


def _wanted(key: str, names: set[str] | None) -> bool:
    """Whether a checkpoint tensor belongs to `names` (whole names or `model.layers.i.` prefixes)."""
    if names is None or key in names:
        return True
    parts = key.split(".")
    return len(parts) > 3 and parts[1] == "layers" and ".".join(parts[:3]) + "." in names


def _read_state_dict(folder: Path, names: set[str] | None) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors, only those in `names` (a pipeline stage reads its slice only)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"no .safetensors weights in {folder}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as weights:
            state.update({key: weights.get_tensor(key) for key in weights.keys() if _wanted(key, names)})
    return state


def load_model(name: str, dtype: torch.dtype, device: torch.device, part: ModelPart | None = None) -> LoadedModel:
    """A model's weights on `device`; with `part`, only that pipeline stage's share is
    allocated and read from the checkpoint."""
    resolved = resolve(name)
    folder = model_folder(name)
    if folder is None:
        arch = arch_from_hf(resolved.dummy_config)
        with torch.device(device):
            model = DecoderModel(arch).to(dtype)
        if part is not None:
            model.drop_layers_outside(part)
        _randomize(model)
        return LoadedModel(name, arch, model.eval(), None, None)
    arch = arch_from_hf(json.loads((folder / "config.json").read_text()))
    with torch.device("meta"):
        model = DecoderModel(arch)
    if part is not None:
        model.drop_layers_outside(part)
    model = model.to_empty(device="cpu")
    model.load_hf_state_dict(_read_state_dict(folder, model.hf_names()))
    model = model.to(device=device, dtype=dtype).eval()
    return LoadedModel(name, arch, model, load_tokenizer(folder), folder)


def _randomize(model: DecoderModel) -> None:
    """Small random weights so dummy activations stay finite at any depth."""
    for name, param in model.named_parameters():
        if "norm" in name:
            continue
        generator = torch.Generator(device=param.device).manual_seed(zlib.crc32(name.encode()))
        param.data.normal_(0.0, 0.02, generator=generator)


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
