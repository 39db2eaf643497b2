"""Where tts keeps what it makes once and reuses: converted GGUF weights, memory profiles,
compiled CPU kernels. A leaf module (it imports nothing from tts), so the loader and the
kernel builder can both import it without importing each other."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`TTS_CACHE_DIR`, or ~/.cache/tts."""
    return Path(os.environ.get("TTS_CACHE_DIR", Path.home() / ".cache" / "tts"))
