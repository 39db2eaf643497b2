"""Weight loading: HF safetensors folders, GGUF files, and dummy random weights.

A GGUF file is dequantized once (transformers' GGUF conversion, built on the `gguf`
package: it knows every tensor-name mapping and llama.cpp's Q/K permutation) and cached
as an HF folder of safetensors + config + tokenizer, so the next load takes seconds and
the HF parity reference reads exactly the same weights.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import struct
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from tts_runtime.config import ConfigError
from tts_runtime.models.arch import ArchConfig, arch_from_hf
from tts_runtime.models.decoder import DecoderModel, ModelPart
from tts_runtime.models.registry import resolve
from tts_runtime.paths import cache_root


def _gguf_cache_dir(gguf: Path) -> Path:
    """The cached conversion's folder, keyed by the file's content (size and a hash of its
    first and last MiB), not its name: a re-downloaded or edited file gets a fresh copy."""
    size = gguf.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with gguf.open("rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(0, size - (1 << 20)))
        digest.update(handle.read(1 << 20))
    return cache_root() / "gguf" / f"{gguf.stem}-{size}-{digest.hexdigest()[:12]}"


def convert_gguf(gguf: Path) -> Path:
    """Dequantize a GGUF file into an HF folder (once) and return the folder. Concurrent
    first loads of one file convert it once: the others wait on a lock, then read it."""
    target = _gguf_cache_dir(gguf)
    if (target / "model.safetensors").is_file():
        _list_added_tokens(target)  # a no-op unless an earlier tts converted it
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "model.safetensors").is_file():
            _convert_into(gguf, target)
    return target


def _list_added_tokens(folder: Path) -> None:
    """Copies tokenizer.json's added tokens into tokenizer_config.json where they are
    missing. transformers 5's save_pretrained leaves them out, and a load without them
    parses the whole tokenizer.json in Python once more: 1.3 s of every Gemma-3 load (33 MB),
    and SmolLM2's takes 1.0 s instead of 0.1 s. The loaded tokenizer is the same
    (tests/models/test_gguf_conversion.py). A cache that cannot be written costs only that time."""
    config_path, tokenizer_path = folder / "tokenizer_config.json", folder / "tokenizer.json"
    if not (config_path.is_file() and tokenizer_path.is_file()):
        return
    config = json.loads(config_path.read_text(encoding="utf-8"))
    if "added_tokens_decoder" in config:
        return
    with tokenizer_path.open(encoding="utf-8") as handle:
        added = json.load(handle)["added_tokens"]
    config["added_tokens_decoder"] = {str(token.pop("id")): token for token in added}
    try:
        descriptor, partial = tempfile.mkstemp(dir=folder, prefix=config_path.name, suffix=".partial")
    except OSError:
        return
    try:
        with open(descriptor, "w", encoding="utf-8") as out:
            json.dump(config, out, indent=2, ensure_ascii=False)
        Path(partial).replace(config_path)
    except OSError:
        Path(partial).unlink(missing_ok=True)


@contextmanager
def _one_gguf_reader() -> Iterator[None]:
    """transformers opens a GGUF file three times in one conversion (tokenizer, config,
    weights), and each `GGUFReader` parses all of its metadata in Python: 2.7 s for
    SmolLM2's, 12 s for Gemma-3's 262k-token vocabulary here. Inside this block every open
    of a path returns the first reader of it (a read-only memory map; transformers imports
    the class where it calls it, so it sees this one)."""
    import gguf

    original = gguf.GGUFReader
    readers: dict[tuple, gguf.GGUFReader] = {}

    def shared(path, *args, **kwargs) -> gguf.GGUFReader:
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = original(path, *args, **kwargs)
        return readers[key]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _convert_into(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _one_gguf_reader():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, IndexError, struct.error, EOFError) as exc:
        raise ConfigError(f"cannot read GGUF file {gguf}: {_first_line(exc)}; the file is corrupt or "
                          "truncated: download it again") from exc
    # A temporary folder of this process's own, renamed last: a killed conversion never leaves
    # a half-written cache behind, and two processes never share one.
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".partial-", dir=target.parent))
    try:
        config = model.config.to_dict()
        config.pop("quantization_config", None)  # the cached copy is plain dequantized weights
        state = model.state_dict()
        if config.get("tie_word_embeddings"):
            state.pop("lm_head.weight", None)
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(tmp)
        _list_added_tokens(tmp)
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


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
        try:
            with safe_open(str(f), framework="pt") as weights:
                state.update({key: weights.get_tensor(key) for key in weights.keys() if _wanted(key, names)})
        except (SafetensorError, OSError) as exc:
            raise ConfigError(f"cannot read weights {f}: {_first_line(exc)}; the file is corrupt or truncated: "
                              "download it again") from exc
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
    arch = arch_from_hf(_hf_config(folder))
    with torch.device("meta"):
        model = DecoderModel(arch)
    if part is not None:
        model.drop_layers_outside(part)
    # Allocated in the run's dtype, the checkpoint converted as it is copied in: allocating
    # fp32 and converting after held a second, fp32 copy of the weights (32 GB for an 8B
    # PRM) and took 0.5 s longer for the demo pair.
    model = model.to(dtype).to_empty(device="cpu")
    model.load_hf_state_dict(_read_state_dict(folder, model.hf_names()))
    model = model.to(device=device).eval()
    return LoadedModel(name, arch, model, load_tokenizer(folder), folder)


def _hf_config(folder: Path) -> dict:
    """config.json, with generation_config.json's end-of-sequence ids added: that file is
    where many chat models list their end-of-turn tokens (Qwen2.5's `<|endoftext|>` beside
    `<|im_end|>`), and vLLM stops on them too."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {folder / 'config.json'}: {_first_line(exc)}") from exc
    generation = folder / "generation_config.json"
    if generation.is_file():
        try:
            extra = json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id")
        except (OSError, ValueError):
            extra = None
        ids = [config.get("eos_token_id"), extra]
        merged = [i for value in ids for i in (value if isinstance(value, list) else [value]) if i is not None]
        if merged:
            config["eos_token_id"] = list(dict.fromkeys(merged))
    return config


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
