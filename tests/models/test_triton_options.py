"""Every Triton kernel launch of tts passes the shared compile options (models/triton_options.py).

The interpreter the CPU tests run drops launch options, so only the source shows a launch
that leaves FMA fusion to the installed Triton's default (a warning on 3.9, fusion off on 3.10).
"""

from __future__ import annotations

import ast

import pytest

from tests.helpers import REPO_ROOT

KERNEL_MODULES = ["tts_runtime/executor/attention/triton_attention.py", "tts_runtime/models/fused_ops.py"]


def kernel_launches(path: str) -> list[ast.Call]:
    """Calls of the form `name_kernel[grid](...)`."""
    tree = ast.parse((REPO_ROOT / path).read_text())
    return [node for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
            and isinstance(node.func.value, ast.Name) and node.func.value.id.endswith("_kernel")]


@pytest.mark.parametrize("path", KERNEL_MODULES)
def test_every_kernel_launch_passes_the_launch_options(path):
    launches = kernel_launches(path)
    assert launches, f"no kernel launch found in {path}"
    missing = [f"{path}:{call.lineno} {call.func.value.id}" for call in launches
               if not any(kw.arg is None and isinstance(kw.value, ast.Name) and kw.value.id == "LAUNCH_OPTIONS"
                          for kw in call.keywords)]
    assert not missing, missing
