"""Problem sets: MATH-500 (local copy or the HF hub) and custom JSONL files."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from search.problem import Problem
from tts_runtime.config import ConfigError
from tts_runtime.options import comma_list, option

KNOWN_DATASETS = ("math500",)
_MATH500_HUB_ID = "HuggingFaceH4/MATH-500"
_MATH500_RELATIVE = Path("math500") / "test.jsonl"


class DatasetError(ConfigError):
    """A dataset that cannot be found or read; the CLI prints it as one line."""


@dataclass(frozen=True)
class DatasetConfig:
    """Which problems a run solves."""

    dataset: str = option("math500", "'math500' or a JSONL file with problem/answer fields.")
    dataset_path: str | None = option(None, "Local MATH-500 copy (file or folder).", panel="Dataset")
    limit: int | None = option(None, "Only the first N problems.")
    levels: tuple[int, ...] | None = option(None, "Only these levels, e.g. 1,2.", panel="Dataset",
                                            parse=comma_list(int, "levels"))
    ids: tuple[str, ...] | None = option(None, "Only these problem ids, comma-separated.", panel="Dataset",
                                         parse=comma_list(str, "ids"))

    def __post_init__(self) -> None:
        if self.ids == ():
            raise DatasetError("--ids is empty; give problem ids, e.g. --ids test/algebra/1.json, or leave it out")
        if self.levels == ():
            raise DatasetError("--levels is empty; give levels, e.g. --levels 1,2, or leave it out")

    def load(self) -> list[Problem]:
        return load_problems(self.dataset, dataset_path=self.dataset_path, limit=self.limit,
                             levels=set(self.levels) if self.levels else None,
                             ids=set(self.ids) if self.ids else None)


def load_problems(
    name_or_path: str,
    *,
    dataset_path: str | None = None,
    limit: int | None = None,
    levels: set[int] | None = None,
    ids: set[str] | None = None,
) -> list[Problem]:
    """Load a named dataset (`math500`) or a JSONL file, then filter by ids, levels and limit."""
    if name_or_path == "math500":
        problems = _load_math500(dataset_path)
    elif Path(name_or_path).is_file():
        problems = _load_jsonl(Path(name_or_path))
    else:
        raise DatasetError(
            f"unknown dataset '{name_or_path}': not a JSONL file and not one of {', '.join(KNOWN_DATASETS)}"
        )
    return _filter(problems, limit=limit, levels=levels, ids=ids)


def _filter(
    problems: list[Problem], *, limit: int | None, levels: set[int] | None, ids: set[str] | None
) -> list[Problem]:
    if limit is not None and limit < 1:
        raise DatasetError(f"--limit must be >= 1, got {limit}; leave it out to run every problem")
    if ids is not None:
        _refuse_unmatched("--ids", ids, {p.id for p in problems})
        problems = [p for p in problems if p.id in ids]
    if levels is not None:
        _refuse_unmatched("--levels", levels, {p.level for p in problems})
        problems = [p for p in problems if p.level in levels]
    if limit is not None:
        problems = problems[:limit]
    return problems


def _refuse_unmatched(option: str, wanted: set, present: set) -> None:
    """A filter entry that selects nothing is a typo, not a request for fewer problems."""
    missing = sorted(str(value) for value in wanted - present)
    if missing:
        raise DatasetError(f"{option} entries that match no problem: {', '.join(missing[:5])}"
                           f"{', ...' if len(missing) > 5 else ''}; check them against the dataset")


def _load_math500(dataset_path: str | None) -> list[Problem]:
    if dataset_path is not None:
        return _load_jsonl(_resolve_explicit(Path(dataset_path)))
    data_dir = os.environ.get("TTS_DATA_DIR")
    if data_dir and (Path(data_dir) / _MATH500_RELATIVE).is_file():
        return _load_jsonl(Path(data_dir) / _MATH500_RELATIVE)
    where = f"TTS_DATA_DIR={data_dir} holds no {_MATH500_RELATIVE}" if data_dir else "TTS_DATA_DIR is unset"
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise _math500_missing(f"{where} and HF_HUB_OFFLINE=1")
    try:
        return _load_hub()
    except Exception as exc:  # any hub/network/cache failure means "no copy available"
        raise _math500_missing(f"{where} and the hub is unreachable: {type(exc).__name__}") from exc


def _resolve_explicit(path: Path) -> Path:
    if path.is_file():
        return path
    for candidate in (path / _MATH500_RELATIVE, path / "test.jsonl"):
        if candidate.is_file():
            return candidate
    raise DatasetError(f"--dataset-path {path}: no such file, nor {_MATH500_RELATIVE} or test.jsonl inside it")


def _math500_missing(reason: str) -> DatasetError:
    return DatasetError(
        f"MATH-500 not found ({reason}): set TTS_DATA_DIR to a folder holding {_MATH500_RELATIVE} "
        "or pass --dataset-path FILE"
    )


def _load_hub() -> list[Problem]:
    from datasets import load_dataset

    rows = load_dataset(_MATH500_HUB_ID, split="test")
    return [_problem(dict(row), index, source=_MATH500_HUB_ID) for index, row in enumerate(rows)]


def _load_jsonl(path: Path) -> list[Problem]:
    problems = []
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise DatasetError(f"{path} line {line} is not UTF-8 text (byte {exc.object[exc.start]:#04x}); "
                           "save the file as UTF-8") from exc
    seen: dict[str, int] = {}
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path} line {index + 1}: invalid JSON ({exc.msg})") from exc
        if not isinstance(row, dict):
            raise DatasetError(f"{path} line {index + 1}: expected a JSON object")
        problem = _problem(row, index, source=f"{path} line {index + 1}")
        if problem.id in seen:
            raise DatasetError(f"{path} line {index + 1}: problem id '{problem.id}' is also on line "
                               f"{seen[problem.id]}; ids must be unique (they key seeds and cached scores)")
        seen[problem.id] = index + 1
        problems.append(problem)
    return problems


def _problem(row: dict[str, Any], index: int, *, source: str) -> Problem:
    for field in ("problem", "answer"):
        if not isinstance(row.get(field), str):
            raise DatasetError(f"{source}: missing string field '{field}'")
        if not row[field].strip():
            raise DatasetError(f"{source}: empty '{field}'")
    subject = row.get("subject")
    return Problem(
        id=str(row.get("unique_id") or index),
        question=row["problem"],
        answer=row["answer"],
        level=_level(row.get("level")),
        subject=str(subject) if subject is not None else None,
    )


def _level(value: Any) -> int | None:
    # MATH-500 stores 3; the original MATH release stores "Level 3".
    match = re.search(r"\d+", str(value)) if value is not None else None
    return int(match.group(0)) if match else None
