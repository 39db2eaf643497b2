"""A run folder: `config.json`, `results.jsonl` (one line per finished problem, flushed and
fsynced as each problem ends) and `metrics.json`.

A killed run loses no finished problem: `--resume` reads `results.jsonl` back, drops a
last line torn by the kill, and skips the problems already there. A problem whose search
raised has a line with its id and `error` instead of a result; `--resume` searches it
again (a later result line for the same id supersedes it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from search.results import FailedProblem, ProblemResult
from tts_runtime.config import ConfigError

CONFIG_FILE = "config.json"
RESULTS_FILE = "results.jsonl"
METRICS_FILE = "metrics.json"
# config.json sections that must match for a resumed run to continue the same experiment.
_RESUME_KEYS = ("method", "search", "models", "dataset")


@dataclass
class RunFolder:
    path: Path
    _results: TextIO | None = field(default=None, repr=False)  # results.jsonl, opened on first append

    @classmethod
    def open(cls, path: str | Path, *, resume: bool) -> RunFolder:
        """The folder for a new run (it must not hold one already) or for `resume`."""
        folder = cls(Path(path))
        if folder.path.exists() and not folder.path.is_dir():
            raise ConfigError(f"output folder {folder.path} is a file; choose another --out")
        if not resume and (folder.path / RESULTS_FILE).exists():
            raise ConfigError(f"output folder {folder.path} already holds a run; "
                              "pass --resume to continue it or choose another --out")
        try:
            folder.path.mkdir(parents=True, exist_ok=True)
            probe = folder.path / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"cannot write to output folder {folder.path}: "
                              f"{exc.strerror or exc}") from exc
        return folder

    # -- config ----------------------------------------------------------------------
    def write_config(self, config: dict[str, Any]) -> None:
        """Write config.json; on resume, first check the stored run is the same experiment."""
        stored = self.read_json(CONFIG_FILE)
        if stored is not None and self.finished_results():
            changed = [key for key in _RESUME_KEYS if stored.get(key) != config.get(key)]
            if changed:
                raise ConfigError(f"cannot resume {self.path}: its {', '.join(changed)} differ from this "
                                  "command's; rerun with the same options or choose another --out")
        self._write_json(CONFIG_FILE, config)

    # -- results ---------------------------------------------------------------------
    def finished_results(self) -> list[ProblemResult]:
        """Results already on disk (failure lines left out)."""
        return [record for record in self._records() if isinstance(record, ProblemResult)]

    def failed_problems(self) -> list[FailedProblem]:
        """Failure lines of problems that have no result line (not solved by a later session)."""
        records = self._records()
        solved = {record.id for record in records if isinstance(record, ProblemResult)}
        return [record for record in records if isinstance(record, FailedProblem) and record.id not in solved]

    def _records(self) -> list[ProblemResult | FailedProblem]:
        """Every line of results.jsonl. A torn last line (the run was killed mid-write) is cut off."""
        path = self.path / RESULTS_FILE
        if not path.exists():
            return []
        data = path.read_bytes()
        good_end = data.rfind(b"\n") + 1
        if good_end < len(data):
            with path.open("r+b") as handle:
                handle.truncate(good_end)
        results = []
        for number, line in enumerate(data[:good_end].decode("utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                results.append(FailedProblem(**row) if "error" in row else ProblemResult.from_dict(row))
            except (json.JSONDecodeError, TypeError) as exc:
                raise ConfigError(f"{path} line {number} is not a result this version can read ({exc}); "
                                  "start a new run with another --out") from exc
        return results

    def append(self, result: ProblemResult | FailedProblem) -> None:
        if self._results is None:
            self._results = (self.path / RESULTS_FILE).open("a", encoding="utf-8")
        self._results.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
        self._results.flush()
        os.fsync(self._results.fileno())

    def close(self) -> None:
        if self._results is not None:
            self._results.close()
            self._results = None

    # -- metrics ---------------------------------------------------------------------
    def write_metrics(self, metrics: dict[str, Any]) -> None:
        self._write_json(METRICS_FILE, metrics)

    # -- helpers ---------------------------------------------------------------------
    def read_json(self, name: str) -> dict[str, Any] | None:
        path = self.path / name
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path} is not valid JSON ({exc.msg}); start a new run with another --out") from exc

    def _write_json(self, name: str, data: dict[str, Any]) -> None:
        # Write then rename: a kill never leaves a half-written file.
        target = self.path / name
        tmp = target.with_suffix(target.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(target)
