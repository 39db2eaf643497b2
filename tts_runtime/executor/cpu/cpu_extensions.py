"""Builds and loads the C++ CPU kernels in csrc/ with torch's extension tooling.

Each kernel is compiled on first use (`make setup` does it once) with -march=native, for
the machine that runs it, and cached under the tts cache folder; a kernel that cannot be
built raises `KernelUnavailable`, and its caller falls back to torch ops.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from types import ModuleType

import torch

from tts_runtime.models.loader import cache_root

CSRC = Path(__file__).parent / "csrc"


class KernelUnavailable(RuntimeError):
    """A C++ kernel could not be built or loaded on this machine."""


def build_dir(source: Path) -> Path:
    """One folder per torch version (the extension links against torch's C++ ABI), per source
    file and contents (its own and the shared headers'), and per Python environment: ninja
    rebuilds whenever a path in its build file changes (the source, the venv's torch headers),
    so two checkouts or two venvs sharing one folder would keep rebuilding each other's kernel
    behind its build lock."""
    digest = hashlib.sha1(str(source).encode() + sys.prefix.encode())
    for path in [source, *sorted(CSRC.glob("*.h"))]:
        digest.update(path.read_bytes())
    return cache_root() / "torch_extensions" / f"torch-{torch.__version__.replace('+', '-')}-{digest.hexdigest()[:12]}"


def load_extension(name: str, source: str, extra_cflags: tuple[str, ...] = ()) -> ModuleType:
    """Builds (first call on a machine, ~1 min) or loads the cached extension `name` from
    csrc/`source`."""
    try:
        from torch.utils.cpp_extension import load

        path = CSRC / source
        folder = build_dir(path)
        folder.mkdir(parents=True, exist_ok=True)
        # The `ninja` dependency installs next to this interpreter, which need not be on PATH
        # (.venv/bin/tts run without activating the venv).
        scripts = str(Path(sys.executable).parent)
        if scripts not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
        # -march=native: the build runs on the machine that uses it (make setup or first use).
        return load(name=name, sources=[str(path)], build_directory=str(folder),
                    extra_cflags=["-O3", "-march=native", "-fopenmp", *extra_cflags], extra_ldflags=["-fopenmp"],
                    verbose=False)
    except Exception as exc:  # any build or load failure means: use the torch ops
        raise KernelUnavailable(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from exc
