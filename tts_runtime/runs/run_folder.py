"""A run folder: `config.json`, `results.jsonl` (one line per finished problem, flushed and
fsynced as each problem ends), `metrics.json` and `history.jsonl` (each start's and each
resume's configuration), held under an exclusive lock for the life of a run.

A killed run loses no finished problem: `--resume` reads `results.jsonl` back, keeps every
complete JSON line (a last line that lost only its newline too), drops a last line torn by
the kill, moves lines it cannot decode to `results.corrupt.jsonl`, and skips the problems
already there. A problem whose search raised has a line with its id and `error` instead of
a result; `--resume` searches it again (a later result line for the same id supersedes it).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import logging
import os
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from search.results import FailedProblem, ProblemResult
from search.sal_outputs import APPROACHES, completions_file
from tts_runtime.config import ConfigError

CONFIG_FILE = "config.json"
RESULTS_FILE = "results.jsonl"
METRICS_FILE = "metrics.json"
HISTORY_FILE = "history.jsonl"
CORRUPT_FILE = "results.corrupt.jsonl"
LOCK_FILE = ".lock"
RUN_FILES = frozenset({CONFIG_FILE, RESULTS_FILE, METRICS_FILE, HISTORY_FILE, CORRUPT_FILE, LOCK_FILE,
                       *(completions_file(method) for method in APPROACHES)})
# config.json sections that must match for a resumed run to continue the same experiment,
# less the fields that change how fast it runs, not what it finds.
_RESUME_KEYS = ("search", "models", "dataset", "backend", "resolved", "fingerprints")
_RESULT_NEUTRAL = {"search": ("problem_batch",), "dataset": ("limit",)}

log = logging.getLogger(__name__)


class RunFolderWriteError(ConfigError):
    """The folder could not take a write (disk full, file-size limit, I/O error): the run
    stops, with every result written so far intact."""


@dataclass
class RunFolder:
    path: Path
    _results: TextIO | None = field(default=None, repr=False)  # results.jsonl, opened on first append
    _lock: int | None = field(default=None, repr=False)  # fd of .lock, flock-ed while the run lives
    _new: bool = field(default=False, repr=False)  # a new run, not a resume
    _made: bool = field(default=False, repr=False)  # open() made the folder

    @classmethod
    def open(cls, path: str | Path, *, resume: bool, fresh: bool = False) -> RunFolder:
        """The folder for a new run (absent or empty) or for `resume` (one that holds a
        run), locked against every other run until `release()` or the process ends.
        `fresh`: a new run in `path` or, where that is taken, in path-2, path-3 ... (the
        default --out, named by the second)."""
        folder = cls(fresh_folder(Path(path)) if fresh else Path(path), _new=not resume)
        folder._made = fresh or not folder.path.exists()
        if folder.path.exists() and not folder.path.is_dir():
            raise ConfigError(f"output folder {folder.path} is a file; choose another --out")
        if resume and not folder.path.is_dir():
            raise ConfigError(f"there is no run to resume in {folder.path}: the folder does not exist; "
                              "check --out, or drop --resume to start a new run")
        try:
            folder.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot write to output folder {folder.path}: {exc.strerror or exc}") from exc
        folder._acquire_lock()
        try:
            folder._check_contents(resume)
        except BaseException:
            folder.release()
            raise
        return folder

    def _acquire_lock(self) -> None:
        lock_path = self.path / LOCK_FILE
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot write to output folder {self.path}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise ConfigError(f"output folder {self.path} is in use by {holder}; wait for that run to end "
                              "or choose another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._lock = fd

    def _check_contents(self, resume: bool) -> None:
        names = {entry.name for entry in self.path.iterdir()}
        foreign = sorted(names - RUN_FILES - {f"{name}.tmp" for name in RUN_FILES}
                         - {n for n in names if n.startswith(".tmp-")})
        if foreign:
            raise ConfigError(f"output folder {self.path} holds files that are not a tts run "
                              f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); "
                              "choose an empty or new --out")
        holds_run = bool(names & {CONFIG_FILE, RESULTS_FILE, HISTORY_FILE})
        if resume and not holds_run:
            raise ConfigError(f"there is no run to resume in {self.path}; check --out, or drop --resume "
                              "to start a new run there")
        if not resume and holds_run:
            raise ConfigError(f"output folder {self.path} already holds a run; "
                              "pass --resume to continue it or choose another --out")

    def abandon_if_empty(self) -> bool:
        """A new run that ends before its first problem is written (an error or Ctrl-C while
        the models load) takes its files back, and the folder where it made it, so that the
        same command, once fixed, starts anew instead of being told to --resume. True where
        it did; a resume, or a run with a result line, keeps everything."""
        if not self._new or (self.path / RESULTS_FILE).exists():
            return False
        self.close()
        for name in (CONFIG_FILE, HISTORY_FILE, LOCK_FILE):
            (self.path / name).unlink(missing_ok=True)
        if self._made:
            self.path.rmdir()
        self.release()
        self._new = False  # once: the folder is gone
        return True

    def release(self) -> None:
        """Close the results file and unlock the folder for other runs."""
        self.close()
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor drops the flock
            self._lock = None

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def __del__(self) -> None:
        # A folder dropped without release() (an API caller's) must not stay locked.
        if self._lock is not None:
            os.close(self._lock)

    # -- config ----------------------------------------------------------------------
    def write_config(self, config: dict[str, Any]) -> None:
        """Record this session's configuration. A new run writes config.json; a resume first
        checks the stored run is the same experiment and leaves config.json as the first
        session wrote it. Either way the session is appended to history.jsonl."""
        stored = self._stored_config()
        if stored is not None and self.finished_results():
            changed = [difference for key in _RESUME_KEYS
                       for difference in _differences(key, _comparable(key, stored), _comparable(key, config))]
            if changed:
                raise ConfigError(f"cannot resume {self.path}: its settings differ from this command's "
                                  f"({'; '.join(changed)}); rerun with the same options or choose another --out")
        if stored is None:
            self._write_json(CONFIG_FILE, config)
        event = "start" if stored is None else "resume"
        self._append_line(HISTORY_FILE, {"event": event, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                         "config": config})

    def _stored_config(self) -> dict[str, Any] | None:
        """config.json, or when a power loss left it empty or torn, the last configuration in
        history.jsonl (None: neither, so this session's configuration becomes the run's)."""
        try:
            return self.read_json(CONFIG_FILE)
        except ConfigError as exc:
            history = _history(self.path)
            log.warning("%s; %s", exc, "using the last configuration in history.jsonl" if history
                        else "the results stay and this command's configuration is taken as the run's")
            if history:
                self._write_json(CONFIG_FILE, history[-1]["config"])
                return history[-1]["config"]
            (self.path / CONFIG_FILE).unlink()
            return None

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
        """Every readable line of results.jsonl. Only the lock holder calls this, so nothing
        else is writing: a last line that does not parse was torn by a kill and is cut off;
        any other line that does not decode is moved to results.corrupt.jsonl."""
        path = self.path / RESULTS_FILE
        if not path.exists():
            return []
        lines = path.read_bytes().split(b"\n")
        last = lines.pop()  # after the final newline: b"" unless the last line lost its newline
        records, keep, corrupt = [], [], []
        for line in lines:
            if not line.strip():
                continue
            record = _decode(line)
            (keep if record is not None else corrupt).append(line)
            if record is not None:
                records.append(record)
        last_record = _decode(last) if last.strip() else None
        if last_record is not None:  # complete, only its newline was lost
            records.append(last_record)
            keep.append(last)
        if corrupt or last.strip():
            if corrupt:
                self._append_bytes(CORRUPT_FILE, b"".join(line + b"\n" for line in corrupt))
                log.warning("%s: %d line(s) that could not be read moved to %s", path, len(corrupt), CORRUPT_FILE)
            self._replace_bytes(RESULTS_FILE, b"".join(line + b"\n" for line in keep))
        return records

    def append(self, result: ProblemResult | FailedProblem) -> None:
        try:
            if self._results is None:
                self._results = (self.path / RESULTS_FILE).open("a", encoding="utf-8")
            self._results.write(json.dumps(result.to_dict(), ensure_ascii=False) + "\n")
            self._results.flush()
            os.fsync(self._results.fileno())
        except OSError as exc:
            # A half-written line stays behind; the next resume cuts it off.
            self._drop_results_handle()
            raise self._write_error(RESULTS_FILE, exc) from exc

    def close(self) -> None:
        if self._results is not None:
            try:
                self._results.close()
            except OSError:
                pass  # the line that failed is already reported; a resume cuts what is torn
            self._results = None

    def _drop_results_handle(self) -> None:
        try:
            self.close()
        except OSError:
            self._results = None

    # -- metrics ---------------------------------------------------------------------
    def write_metrics(self, metrics: dict[str, Any]) -> None:
        self._write_json(METRICS_FILE, metrics)

    def write_rows(self, name: str, rows: list[dict[str, Any]]) -> None:
        """A derived JSONL file (S&L's completions), replaced whole."""
        self._replace_bytes(name, b"".join((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
                                           for row in rows))

    # -- helpers ---------------------------------------------------------------------
    def read_json(self, name: str) -> dict[str, Any] | None:
        path = self.path / name
        if not path.exists():
            return None
        try:
            return json.loads(path.read_bytes().decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} is not valid JSON ({getattr(exc, 'msg', exc)})") from exc

    def _write_json(self, name: str, data: dict[str, Any]) -> None:
        self._replace_bytes(name, (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))

    def _replace_bytes(self, name: str, data: bytes) -> None:
        """Temp file + fsync + rename + fsync of the folder: after a crash or a power loss the
        file is the old one or the new one, never a mix, and the rename itself is durable."""
        tmp = self.path / f".tmp-{name}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, self.path / name)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            self._fsync_folder()
        except OSError as exc:
            raise self._write_error(name, exc) from exc

    def _append_line(self, name: str, data: dict[str, Any]) -> None:
        self._append_bytes(name, (json.dumps(data, ensure_ascii=False) + "\n").encode("utf-8"))

    def _append_bytes(self, name: str, data: bytes) -> None:
        try:
            with (self.path / name).open("ab") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            raise self._write_error(name, exc) from exc

    def _fsync_folder(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_error(self, name: str, exc: OSError) -> RunFolderWriteError:
        full = exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
        reason = "the disk is full (or a file-size limit was reached)" if full else (exc.strerror or str(exc))
        return RunFolderWriteError(f"cannot write {self.path / name}: {reason}; the results written so far are "
                                   f"intact: free space and continue with --resume --out {self.path}")


def fresh_folder(base: Path) -> Path:
    """`base`, or `base-2`, `base-3` ... where it is taken, created here: the default output
    folder is named by the second, and runs started in the same second (one per GPU from a
    script) must not share it. mkdir is atomic, so two processes never claim the same one."""
    for attempt in itertools.count(1):
        path = base if attempt == 1 else base.with_name(f"{base.name}-{attempt}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigError(f"cannot write to output folder {path}: {exc.strerror or exc}") from exc
    raise AssertionError("unreachable")


def latest_config(run: Path) -> dict[str, Any] | None:
    """The configuration `run`'s last session ran with (a resume may have raised --limit or
    changed --problem-batch since config.json was written): the last entry of history.jsonl,
    else config.json; None where neither is readable. Reads only: the lock holder repairs."""
    history = _history(run)
    if history:
        return history[-1]["config"]
    try:
        config = json.loads((run / CONFIG_FILE).read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return config if isinstance(config, dict) else None


def _history(run: Path) -> list[dict[str, Any]]:
    path = run / HISTORY_FILE
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    entries = []
    for line in lines:
        try:
            entries.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue  # a torn last entry: the earlier ones still tell the story
    return [entry for entry in entries if isinstance(entry, dict) and isinstance(entry.get("config"), dict)]


def _decode(line: bytes) -> ProblemResult | FailedProblem | None:
    try:
        row = json.loads(line.decode("utf-8"))
        return FailedProblem(**row) if "error" in row else ProblemResult.from_dict(row)
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError, AttributeError):
        return None


def _differences(path: str, stored: Any, given: Any) -> list[str]:
    """Each setting that differs, as `path: the run's value -> this command's`, so that a
    refused resume names the option to fix; a file's fingerprint (hashes) as its name."""
    if path.startswith("fingerprints.") and stored != given:
        return [f"{path}: the file's content is not what the run started with"]
    if isinstance(stored, dict) and isinstance(given, dict):
        return [difference for name in sorted(stored.keys() | given.keys())
                for difference in _differences(f"{path}.{name}", stored.get(name), given.get(name))]
    return [] if stored == given else [f"{path}: {stored!r} -> {given!r}"]


def _comparable(key: str, config: dict[str, Any]) -> Any:
    section = config.get(key)
    neutral = _RESULT_NEUTRAL.get(key)
    if not neutral or not isinstance(section, dict):
        return section
    return {name: value for name, value in section.items() if name not in neutral}
