"""Builds and loads the C++ CPU kernels in csrc/ with torch's extension tooling.

Each kernel is compiled on first use (`make setup` builds them all at once, in parallel:
cpu_build.py) for the instruction set `cpu_features.march()` names (-march=native, or
x86-64-v3 under TTS_CPU_FEATURES=avx2) and cached under the tts cache folder, one folder
per instruction set; a kernel that cannot be built raises `KernelUnavailable`, and its
caller falls back to torch ops.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch

import tts_runtime.cpu_features as cpu_features
from tts_runtime.paths import cache_root

CSRC = Path(__file__).parent / "csrc"


class KernelUnavailable(RuntimeError):
    """A C++ kernel could not be built or loaded on this machine."""


def build_dir(source: Path, march: str | None = None) -> Path:
    """One folder per torch version (the extension links against torch's C++ ABI), per
    instruction set the build targets (`cpu_features.isa_key()`: -march=native on another
    CPU is another binary, and an AVX-512 one dies of SIGILL on an AVX2 CPU), per source file
    and contents (its own and the shared headers'), and per Python environment: ninja
    rebuilds whenever a path in its build file changes (the source, the venv's torch headers),
    so two checkouts or two venvs sharing one folder would keep rebuilding each other's kernel
    behind its build lock."""
    digest = hashlib.sha1(str(source).encode() + sys.prefix.encode())
    for path in [source, *sorted(CSRC.glob("*.h"))]:
        digest.update(path.read_bytes())
    return (cache_root() / "torch_extensions"
            / f"torch-{torch.__version__.replace('+', '-')}-{cpu_features.isa_key(march)}-{digest.hexdigest()[:12]}")


def cflags(extra_cflags: tuple[str, ...] = (), march: str | None = None) -> list[str]:
    return ["-O3", f"-march={march or cpu_features.march()}", "-fopenmp", *extra_cflags]


def load_extension(name: str, source: str, extra_cflags: tuple[str, ...] = (),
                   march: str | None = None) -> ModuleType:
    """Builds (first call on a machine, tens of seconds) or loads the cached extension `name`
    from csrc/`source`, for `march` (default `cpu_features.march()`)."""
    try:
        from torch.utils.cpp_extension import load

        path = CSRC / source
        march = march or cpu_features.march()
        folder = build_dir(path, march)
        folder.mkdir(parents=True, exist_ok=True)
        # The `ninja` dependency installs next to this interpreter, which need not be on PATH
        # (.venv/bin/tts run without activating the venv).
        scripts = str(Path(sys.executable).parent)
        if scripts not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
        # The module name carries the instruction set too: one process may load both builds
        # (the tests of the x86-64-v3 build beside the native one).
        suffix = "" if march == "native" else "_" + march.replace("-", "_")
        with _build_lock(folder):
            return load(name=name + suffix, sources=[str(path)], build_directory=str(folder),
                        extra_cflags=cflags(extra_cflags, march), extra_ldflags=["-fopenmp"], verbose=False)
    except Exception as exc:  # any build or load failure means: use the torch ops
        raise KernelUnavailable(_summary(exc)) from exc


@contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """Our lock around torch's. Torch's is a plain file (`lock`) that a killed build (Ctrl-C
    during `make setup`) leaves behind, and every later build then waits on it forever; an
    flock dies with its process, so while this one is held a `lock` file is such a leftover."""
    with (folder / "tts-build.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        (folder / "lock").unlink(missing_ok=True)
        yield


def _summary(exc: Exception) -> str:
    """One line: the compiler's first error where there is one (a failed build's message
    starts with the whole compile command), else the exception's start."""
    text = str(exc)
    errors = [line.strip() for line in text.splitlines() if "error:" in line]
    return f"{type(exc).__name__}: {' '.join((errors[0] if errors else text).split())[:300]}"
