"""Content fingerprints of a run's model and dataset files, for `--resume` to compare.

A name says nothing about content: a re-downloaded model, an edited dataset or another
`TTS_DATA_DIR` can sit behind the same name. A model's fingerprint hashes its
`config.json` whole and, of each weight file, the size and the first and last MiB (a
changed checkpoint changes its header or its size; reading GBs on every resume would
not be worth the last bit of certainty). A dataset file is small: all of it is hashed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tts_runtime.config import ConfigError

_EDGE = 1 << 20  # bytes hashed at each end of a weight file
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")
_CHUNK = 1 << 20


def _edges_sha256(path: Path, size: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        digest.update(handle.read(_EDGE))
        if size > _EDGE:
            handle.seek(max(_EDGE, size - _EDGE))
            digest.update(handle.read(_EDGE))
    return digest.hexdigest()


def _weight_entry(path: Path) -> dict:
    size = path.stat().st_size
    return {"size": size, "edges_sha256": _edges_sha256(path, size)}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def model_fingerprint(path: Path) -> dict:
    """An HF folder (config.json + weight files) or a single .gguf file."""
    path = Path(path)
    if path.is_file():
        return {"kind": "file", "weights": {path.name: _weight_entry(path)}}
    if not path.is_dir():
        raise ConfigError(f"model path {path} does not exist; pass a model folder or a .gguf file")
    config = path / "config.json"
    weights = sorted(p for p in path.iterdir() if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES))
    if not config.is_file() or not weights:
        raise ConfigError(f"model folder {path} holds no config.json and weight files "
                          f"({', '.join(_WEIGHT_SUFFIXES)}); pass an HF model folder or a .gguf file")
    return {"kind": "folder", "config_sha256": file_sha256(config),
            "weights": {p.name: _weight_entry(p) for p in weights}}


def dataset_fingerprint(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"dataset file {path} does not exist; pass --dataset-path with a .jsonl file")
    return {"size": path.stat().st_size, "sha256": file_sha256(path)}
