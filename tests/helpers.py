"""What several test files share that is not a fixture: where the repository and the data are,
the demo model names, a fixed set of chat prompts and the comparison of two searches. Fixtures live in conftest.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
GENERATOR = "smollm2-135m-instruct"
PRM = "gemma3-270m"

# Short math (and two non-math) questions, for parity and backend checks on real prompts.
QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "What is the value of $\\sqrt{36 \\times \\sqrt{16}}$?",
    "A rectangle has a perimeter of 30 units and its length is twice its width. What is its area?",
    "Solve for x: 3x - 7 = 11.",
    "Write a short poem about prime numbers.",
    "If f(x) = 2x^2 + 3, what is f(4)?",
    "Explain in one paragraph why the sum of two even numbers is even.",
    "Tom has 3 times as many marbles as Jerry. Together they have 64 marbles. How many does Tom have?",
]


def shared_data_dir() -> Path:
    """The data folder (MATH-500 and the rest): $TTS_DATA_DIR, which the Makefile and CI
    export; a bare pytest run falls back to the shared checkout beside the repository."""
    env = os.environ.get("TTS_DATA_DIR")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def question_prompts(loaded) -> list[list[int]]:
    """QUESTIONS as token ids for a loaded model: its chat template where it has one."""
    tok = loaded.tokenizer
    if tok.chat_template:
        return [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=True,
                                        add_generation_prompt=True, return_dict=False) for q in QUESTIONS]
    return [tok(f"Question: {q}\nAnswer:")["input_ids"] for q in QUESTIONS]


def default_sigint() -> None:
    """A child's preexec_fn: SIGINT back to its default, so Python installs its Ctrl-C handler
    even where the test run itself ignores SIGINT (a job started in the background by a
    non-interactive shell, `nohup make test &`)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ended_by_ctrl_c(returncode: int | None) -> bool:
    """Exit code 130, or death by SIGINT: a shell reports both as 130. Now and then CPython ends a
    process whose code handled the KeyboardInterrupt and raised SystemExit(130) by re-raising SIGINT
    on itself (bpo-1054041's exit for an unhandled Ctrl-C); seen when the interrupt landed inside a
    lazy import or the model load, about one time in twenty."""
    return returncode in (130, -signal.SIGINT)


def assert_same_search(first: list, second: list) -> None:
    """Two searches' ProblemResults are the same search: the same problems, beam steps,
    predictions and token counts, and step scores equal but for the last float bits (batched
    matmuls sum in another order)."""
    assert [r.id for r in first] == [r.id for r in second]
    for a, b in zip(first, second):
        assert [beam.steps for beam in a.beams] == [beam.steps for beam in b.beams], a.id
        assert (a.prediction, a.generated_tokens, a.prm_tokens) == (b.prediction, b.generated_tokens, b.prm_tokens)
        for x, y in zip(a.beams, b.beams):
            assert x.step_scores == pytest.approx(y.step_scores, rel=1e-5), a.id


def compile_kernels_for_sm90(group: str) -> list[dict[str, str | int | None]]:
    """`python -m evals.kernel_resources --only GROUP --json` (the Triton kernels compiled for
    sm_90 with the wheel's ptxas: no GPU needed) in a process of its own, since a test process's
    triton may be interpreting; one dict per build (kernel, config, num_warps, registers,
    stack_bytes ...). Its builds ask for FMA fusion as tts's launches do
    (models/triton_options.py), so Triton has no default to warn about."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "TRITON_DEFAULT_FP_FUSION")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-m", "evals.kernel_resources", "--only", group, "--json"], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TRITON_DEFAULT_FP_FUSION" not in proc.stderr, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]