"""Problem sets: MATH-500 (local copy or the HF hub), custom JSONL files and Hugging Face
Hub datasets, selected by one `DatasetConfig`."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from search.problem import Problem
from tts_runtime.config import ConfigError
from tts_runtime.hub import HUB_ID, hub_snapshot
from tts_runtime.options import comma_list, option

KNOWN_DATASETS = ("math500",)
_MATH500_HUB_ID = "HuggingFaceH4/MATH-500"
_MATH500_RELATIVE = Path("math500") / "test.jsonl"


class DatasetError(ConfigError):
    """A dataset that cannot be found or read; the CLI prints it as one line."""


@dataclass(frozen=True)
class DatasetConfig:
    """Which problems a run solves. Rows are sliced by position first (dataset_start/end, as
    search-and-learn does), then filtered by ids and levels, then cut to `limit`."""

    dataset: str = option("math500", "'math500', a JSONL file with problem/answer fields, or a Hugging Face Hub "
                          "dataset id (org/name or org/name@revision).")
    dataset_path: str | None = option(None, "Local MATH-500 copy (file or folder) for --dataset math500.",
                                      panel="Dataset")
    limit: int | None = option(None, "Only the first N problems.")
    levels: tuple[int, ...] | None = option(None, "Only these levels, e.g. 1,2.", panel="Dataset",
                                            parse=comma_list(int, "levels"))
    ids: tuple[str, ...] | None = option(None, "Only these problem ids, comma-separated.", panel="Dataset",
                                         parse=comma_list(str, "ids"))
    dataset_config: str | None = option(None, "Configuration (subset) of a Hub dataset.", panel="Dataset")
    dataset_split: str = option("test", "Split of a Hub dataset.", panel="Dataset")
    dataset_start: int | None = option(None, "First row (0-based) of the dataset to use, before the other filters.",
                                       panel="Dataset")
    dataset_end: int | None = option(None, "Row after the last one to use (exclusive), before the other filters.",
                                     panel="Dataset")
    problem_column: str = option("problem", "Column holding the problem text.", panel="Dataset")
    answer_column: str = option("answer", "Column holding the reference answer.", panel="Dataset")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        checks = [
            (self.dataset.strip() != "", "--dataset is empty; name 'math500', a JSONL file or a Hub dataset id"),
            (self.limit is None or self.limit >= 1,
             f"--limit must be >= 1, got {self.limit}; leave it out to run every problem"),
            (self.ids is None or len(self.ids) > 0,
             "--ids is empty; give at least one problem id, or leave --ids out to run every problem"),
            (self.levels is None or len(self.levels) > 0,
             "--levels is empty; give at least one level, e.g. 1,2, or leave --levels out"),
            (self.dataset_start is None or self.dataset_start >= 0,
             f"--dataset-start must be >= 0, got {self.dataset_start}"),
            (self.dataset_end is None or self.dataset_end >= 0,
             f"--dataset-end must be >= 0, got {self.dataset_end}"),
            (self.dataset_start is None or self.dataset_end is None or self.dataset_start < self.dataset_end,
             f"--dataset-start ({self.dataset_start}) must be below --dataset-end ({self.dataset_end}): "
             "the end is exclusive"),
            (self.dataset_split.strip() != "", "--dataset-split is empty; name a split, e.g. test"),
            (self.problem_column.strip() != "" and self.answer_column.strip() != "",
             "--problem-column and --answer-column must name columns"),
            (self.dataset_path is None or self.dataset == "math500",
             f"--dataset-path is a local MATH-500 copy and applies to --dataset math500 only, not "
             f"'{self.dataset}'; drop it"),
        ]
        for ok, message in checks:
            if not ok:
                raise DatasetError(message)


def load_problems(config: DatasetConfig) -> list[Problem]:
    """The problems `config` selects, in dataset order."""
    columns = (config.problem_column, config.answer_column)
    if config.dataset == "math500":
        if config.dataset_config is not None or config.dataset_split != "test":
            raise DatasetError("math500 is MATH-500's test split and has no configs; drop --dataset-config "
                               "and --dataset-split")
        problems = _load_math500(config.dataset_path, columns)
    elif Path(config.dataset).is_file():
        if config.dataset_config is not None:
            raise DatasetError(f"--dataset-config applies to Hub datasets, not the file {config.dataset}; drop it")
        problems = _load_jsonl(Path(config.dataset), columns)
    elif HUB_ID.fullmatch(config.dataset) and not Path(config.dataset).exists():
        problems = _load_hub_dataset(config, columns)
    else:
        raise DatasetError(
            f"unknown dataset '{config.dataset}': not a JSONL file, not a Hugging Face Hub id (org/name) "
            f"and not one of {', '.join(KNOWN_DATASETS)}"
        )
    if not problems:
        source = config.dataset_path if config.dataset == "math500" and config.dataset_path else config.dataset
        raise DatasetError(f"the dataset {source} holds no problems; check the file or split")
    if not problems[config.dataset_start:config.dataset_end]:
        raise DatasetError(f"--dataset-start/--dataset-end select none of the dataset's {len(problems)} problems "
                           f"(rows 0 to {len(problems) - 1})")
    problems = problems[config.dataset_start:config.dataset_end]
    return _filter(problems, limit=config.limit, levels=config.levels, ids=config.ids)


def _filter(problems: list[Problem], *, limit: int | None, levels: tuple[int, ...] | None,
            ids: tuple[str, ...] | None) -> list[Problem]:
    if ids is not None:
        wanted_ids = set(ids)
        _refuse_unmatched("--ids", wanted_ids, {p.id for p in problems})
        problems = [p for p in problems if p.id in wanted_ids]
    if levels is not None:
        wanted_levels = set(levels)
        _refuse_unmatched("--levels", wanted_levels, {p.level for p in problems})
        problems = [p for p in problems if p.level in wanted_levels]
    if limit is not None:
        problems = problems[:limit]
    return problems


def _refuse_unmatched(option: str, wanted: set, present: set) -> None:
    """A filter entry that selects nothing is a typo, not a request for fewer problems."""
    missing = sorted(str(value) for value in wanted - present)
    if missing:
        raise DatasetError(f"{option} entries that match no problem: {', '.join(missing[:5])}"
                           f"{', ...' if len(missing) > 5 else ''}; check them against the dataset")


def local_dataset_file(config: DatasetConfig) -> Path | None:
    """The local file the problems are read from (None: a Hub dataset, or MATH-500 from the Hub)."""
    if config.dataset == "math500":
        if config.dataset_path is not None:
            return _resolve_explicit(Path(config.dataset_path))
        data_dir = os.environ.get("TTS_DATA_DIR")
        copy = Path(data_dir) / _MATH500_RELATIVE if data_dir else None
        return copy if copy is not None and copy.is_file() else None
    path = Path(config.dataset)
    return path if path.is_file() else None


def _load_math500(dataset_path: str | None, columns: tuple[str, str]) -> list[Problem]:
    local = local_dataset_file(DatasetConfig(dataset_path=dataset_path))
    if local is not None:
        return _load_jsonl(local, columns)
    data_dir = os.environ.get("TTS_DATA_DIR")
    where = f"TTS_DATA_DIR={data_dir} holds no {_MATH500_RELATIVE}" if data_dir else "TTS_DATA_DIR is unset"
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise _math500_missing(f"{where} and HF_HUB_OFFLINE=1")
    try:
        return _hub_problems(_MATH500_HUB_ID, None, None, "test", columns)
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


def _load_hub_dataset(config: DatasetConfig, columns: tuple[str, str]) -> list[Problem]:
    repo_id, _, revision = config.dataset.partition("@")
    return _hub_problems(repo_id, revision or None, config.dataset_config, config.dataset_split, columns)


def _hub_problems(repo_id: str, revision: str | None, subset: str | None, split: str,
                  columns: tuple[str, str]) -> list[Problem]:
    """Rows of a Hub dataset's split: the repository comes through huggingface_hub's cache
    (HF_HOME / HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE apply), then `datasets` reads that local
    copy, so its configs and split files are read as the Hub's dataset viewer reads them."""
    from datasets import load_dataset

    folder = hub_snapshot(repo_id, revision, kind="dataset", error=DatasetError)
    at = f"{repo_id}@{revision}" if revision else repo_id
    try:
        rows = load_dataset(str(folder), name=subset, split=split)
    except ValueError as exc:  # an unknown split or config; the message lists the ones there are
        first = " ".join(str(exc).split("\n")[0].split()).rstrip(".")
        raise DatasetError(f"dataset {at}: {first}; check --dataset-config and --dataset-split") from None
    source = f"{at} ({split})"
    return _unique([_problem(dict(row), index, columns, source=f"{source} row {index}")
                    for index, row in enumerate(rows)], source)


def _unique(problems: list[Problem], source: str) -> list[Problem]:
    seen: set[str] = set()
    for problem in problems:
        if problem.id in seen:
            raise DatasetError(f"{source}: problem id '{problem.id}' appears twice; ids must be unique "
                               "(they key seeds and cached scores)")
        seen.add(problem.id)
    return problems


def _load_jsonl(path: Path, columns: tuple[str, str]) -> list[Problem]:
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
        problem = _problem(row, index, columns, source=f"{path} line {index + 1}")
        if problem.id in seen:
            raise DatasetError(f"{path} line {index + 1}: problem id '{problem.id}' is also on line "
                               f"{seen[problem.id]}; ids must be unique (they key seeds and cached scores)")
        seen[problem.id] = index + 1
        problems.append(problem)
    return problems


def _problem(row: dict[str, Any], index: int, columns: tuple[str, str], *, source: str) -> Problem:
    for column in columns:
        if not isinstance(row.get(column), str):
            raise DatasetError(f"{source}: missing string field '{column}'" + _column_hint(row, column, columns))
        if not row[column].strip():
            raise DatasetError(f"{source}: empty '{column}'")
    subject = row.get("subject")
    return Problem(
        id=str(row.get("unique_id") or index),
        question=row[columns[0]],
        answer=row[columns[1]],
        level=_level(row.get("level")),
        subject=str(subject) if subject is not None else None,
    )


def _column_hint(row: dict[str, Any], column: str, columns: tuple[str, str]) -> str:
    option = "--problem-column" if column == columns[0] else "--answer-column"
    return f" (columns: {', '.join(sorted(row)[:8])}; name the right one with {option})"


def _level(value: Any) -> int | None:
    # MATH-500 stores 3; the original MATH release stores "Level 3".
    match = re.search(r"\d+", str(value)) if value is not None else None
    return int(match.group(0)) if match else None
