"""A differential check against search-and-learn's own code:

    python -m evals.sal_diff --sal-repo PATH [--sal-exact] [--backend vllm] ...

runs S&L's beam search (its `sal.search.beam_search.beam_search`, its RLHFlow scoring code,
its vLLM generator; evals/sal_side.py) and ours (`tts beam`) on the same demo models, at
temperature 0, on a few MATH-500 problems, and reports per problem where the completions,
their step scores and the predictions differ (evals/sal_compare.py). With `--sal-exact` on
our side the two must agree; the exit status is 1 when they do not. Without it the report
lists the differences tts makes on purpose (docs/semantics.md).

S&L is not vendored: `--sal-repo` is the root of a checkout, and `--sal-deps` folders hold
S&L's own imports that this environment lacks (its beam search imports `sal.utils.math`,
which imports latex2sympy2 and word2number). Each side runs in a child process of its own.
It needs vLLM (the .venv-vllm environment), so no CI runs it; docs/semantics.md holds its
last result.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from evals.sal_compare import SideResult, compare, report_json, report_markdown
from evals.sal_side import SalRequest, request_json
from search.problem import Problem
from search.sal_outputs import completions_file
from tts_runtime.config import ConfigError
from tts_runtime.models.loader import model_folder
from tts_runtime.models.registry import DEFAULT_GENERATOR, DEFAULT_PRM
from tts_runtime.options import comma_list, option, option_fields, with_options
from tts_runtime.runs.datasets import DatasetConfig, load_problems

ROOT = Path(__file__).resolve().parent.parent
SAL_SEED = 0  # every S&L recipe's seed (our --sal-exact default too)


@dataclass(frozen=True)
class SalDiffConfig:
    sal_repo: str = option("", "Root of a search-and-learn checkout (its src/ is imported).")
    sal_deps: tuple[str, ...] = option((), "Folders put on sys.path for S&L's side only, holding S&L's own "
                                       "imports missing here (latex2sympy2, word2number, antlr4 4.7.2).",
                                       parse=comma_list(str, "sal-deps"))
    sal_exact: bool = option(False, "Our side with --sal-exact: then both must agree.")
    backend: str = option("native", "Our side's engines: native or vllm (S&L's generator is always vLLM).")
    generator: str = option(DEFAULT_GENERATOR, "Generator (both sides).")
    prm: str = option(DEFAULT_PRM, "PRM (both sides), scored in the RLHFlow format by S&L's RLHFFlow code.")
    limit: int = option(5, "Problems.", at_least=1)
    levels: tuple[int, ...] = option((1, 2), "MATH-500 levels to take them from.", parse=comma_list(int, "levels"))
    n: int = option(4, "Beams.", at_least=1)
    beam_width: int = option(2, "Beam width M (n // M kept each iteration).", at_least=1)
    num_iterations: int = option(4, "Iterations.", at_least=1)
    max_tokens: int = option(96, "Token cap of every step and of the last iteration's run to the end.", at_least=1)
    # Both sides run the PRM in float32 on different kernels (HF transformers / ours or vLLM):
    # step probabilities then differ by rounding, ~1e-6 measured on the demo PRM.
    tolerance: float = option(1e-4, "Largest step-score difference counted as equal.")
    out_dir: str = option("runs/sal-diff", "Folder for both sides' outputs, logs and the report.")

    def __post_init__(self) -> None:
        if not self.sal_repo:
            raise ConfigError("--sal-repo is required: the root of a search-and-learn checkout "
                              "(git clone https://github.com/huggingface/search-and-learn)")
        if not (Path(self.sal_repo).expanduser() / "src" / "sal").is_dir():
            raise ConfigError(f"--sal-repo {self.sal_repo} holds no src/sal; pass the root of a "
                              "search-and-learn checkout")
        if self.backend not in ("native", "vllm"):
            raise ConfigError(f"--backend {self.backend}: choose native or vllm")
        if self.limit < 1 or self.tolerance < 0:
            raise ConfigError("--limit must be >= 1 and --tolerance >= 0")


def sal_request(config: SalDiffConfig, problems: list[Problem], out: Path) -> SalRequest:
    """S&L's `Config`: the beam-search recipe's choices (filter_duplicates on, sort_completed
    off, last-step aggregation, no lookahead, seed 0) at our size, greedy, the generator's
    own chat template (S&L's default custom template is Llama 3's) and its default system prompt."""
    settings = {"n": config.n, "beam_width": config.beam_width, "num_iterations": config.num_iterations,
                "max_tokens": config.max_tokens, "temperature": 0.0, "seed": SAL_SEED,
                "custom_chat_template": None, "filter_duplicates": True, "sort_completed": False,
                "agg_strategy": "last", "lookahead": 0}
    deps = [str(Path(folder).expanduser().resolve()) for folder in config.sal_deps]
    return SalRequest(str(Path(config.sal_repo).expanduser().resolve()), deps,
                      str(model_folder(config.generator)), str(model_folder(config.prm)), settings,
                      [{"id": p.id, "question": p.question} for p in problems], str(out / "sal_completions.jsonl"))


def tts_command(config: SalDiffConfig, problems: list[Problem], out: Path) -> list[str]:
    """`tts beam` with the same search: every step capped like S&L's (max_tokens), float32."""
    command = [sys.executable, "-m", "tts_runtime.cli", "beam", "--generator", config.generator,
               "--prm", config.prm, "--prm-format", "rlhflow", "--n", str(config.n),
               "--beam-width", str(config.beam_width), "--num-iterations", str(config.num_iterations),
               "--max-step-tokens", str(config.max_tokens), "--max-tokens", str(config.max_tokens),
               "--temperature", "0", "--dtype", "float32", "--backend", config.backend,
               "--ids", ",".join(p.id for p in problems), "--out", str(out)]
    return command + (["--sal-exact"] if config.sal_exact else [])


def _run(command: list[str], log: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with log.open("w", encoding="utf-8") as sink:
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed (exit {done.returncode}); see {log}")


def run_sal_side(request: SalRequest, out: Path) -> list[SideResult]:
    """S&L's results; a previous run of the same request in `out` is reused (S&L's side does
    not depend on our options)."""
    request_file, results = out / "sal_request.json", Path(request.output)
    text = request_json(request)
    if not (results.is_file() and request_file.is_file() and request_file.read_text(encoding="utf-8") == text):
        results.unlink(missing_ok=True)
        request_file.write_text(text, encoding="utf-8")
        _run([sys.executable, "-m", "evals.sal_side", str(request_file)], out / "sal_side.log")
    return [SideResult.from_row(json.loads(line)) for line in results.read_text(encoding="utf-8").splitlines()]


def run_tts_side(config: SalDiffConfig, problems: list[Problem], out: Path) -> list[SideResult]:
    folder = out / ("tts-sal-exact" if config.sal_exact else "tts") / config.backend
    if folder.exists():
        raise SystemExit(f"{folder} exists from an earlier check; remove it or pick another --out-dir")
    folder.parent.mkdir(parents=True, exist_ok=True)
    _run(tts_command(config, problems, folder), folder.parent / f"{config.backend}.log")
    rows = (folder / completions_file("beam")).read_text(encoding="utf-8").splitlines()
    return [SideResult.from_row(json.loads(line)) for line in rows]


def commit(repo: Path) -> str:
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or "unknown"


def sal_diff(config: SalDiffConfig, argv: list[str]) -> bool:
    """Run both sides, write sal_diff.md/.json into the out folder; True when every problem agrees."""
    out = Path(config.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    problems = load_problems(DatasetConfig(levels=config.levels, limit=config.limit))
    sal = run_sal_side(sal_request(config, problems, out), out)
    ours = run_tts_side(config, problems, out)
    diffs = compare(sal, ours, config.tolerance)
    stem = f"sal_diff-{'sal-exact' if config.sal_exact else 'default'}-{config.backend}"
    header = [f"# search-and-learn vs tts ({'--sal-exact' if config.sal_exact else 'tts defaults'}, "
              f"--backend {config.backend})", "",
              f"tts {commit(ROOT)}, search-and-learn {commit(Path(config.sal_repo).expanduser())}; "
              f"`python -m evals.sal_diff {' '.join(argv)}`", ""]
    markdown = report_markdown(diffs, config.tolerance, header)
    (out / f"{stem}.md").write_text(markdown, encoding="utf-8")
    (out / f"{stem}.json").write_text(json.dumps(report_json(diffs, config.tolerance), indent=2), encoding="utf-8")
    print(markdown)
    return all(diff.agree for diff in diffs)


def parse_args(argv: list[str]) -> SalDiffConfig:
    """The SalDiffConfig fields as `--flag value` options (booleans as plain flags)."""
    parser = argparse.ArgumentParser(prog="python -m evals.sal_diff", description=__doc__.split("\n\n")[0])
    specs = option_fields(SalDiffConfig)
    for flag, spec in specs.items():
        name = "--" + flag.replace("_", "-")
        if spec.type is bool:
            parser.add_argument(name, action="store_true", default=None, help=spec.spec.help)
        else:
            parser.add_argument(name, default=None, help=f"{spec.spec.help} (default: {spec.default})")
    given = {flag: value for flag, value in vars(parser.parse_args(argv)).items() if value is not None}
    return with_options(SalDiffConfig(sal_repo=given.get("sal_repo", "")), given)


def main(argv: list[str]) -> int:
    try:
        config = parse_args(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if sal_diff(config, argv) or not config.sal_exact else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
