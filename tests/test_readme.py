"""The README's Python examples run as a user would paste them: each block in its own
interpreter, from the repository root, on the demo models and MATH-500."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers import REPO_ROOT, shared_data_dir

_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _python_blocks() -> list[str]:
    return _BLOCK.findall((REPO_ROOT / "README.md").read_text(encoding="utf-8"))


def _run(code: str) -> str:
    env = {**os.environ, "TTS_DATA_DIR": str(shared_data_dir())}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_readme_has_the_search_and_engine_examples():
    blocks = _python_blocks()
    assert len(blocks) == 2
    assert "run_search" in blocks[0] and "Engine(" in blocks[1]


def test_search_example_prints_one_line_per_problem():
    lines = _run(_python_blocks()[0]).splitlines()
    assert len(lines) == 2  # load_problems(..., limit=2)
    for line in lines:
        problem_id, _prediction, correct, score = line.rsplit(" ", 3)
        assert problem_id.startswith("test/") and problem_id.endswith(".json")
        assert correct in ("True", "False")
        assert 0.0 <= float(score) <= 1.0


def test_engine_example_prints_a_completion():
    assert _run(_python_blocks()[1]).strip() != ""
