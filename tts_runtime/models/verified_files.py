"""Files whose whole content a check has read once, remembered by their stat.

The demo PRM's package verifies its assembled 253 MB GGUF by hashing all of it on every
call, and a run resolves its models several times: 0.8 s per start-up with the file in the
page cache, 3 s and more without. A file whose size, mtime and inode are those it had when
its hash last matched has not been rewritten since (an interrupted or repeated assembly
writes it again), so the check runs once per file, as make and ccache trust a stat.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from tts_runtime.paths import cache_root


def _record_file() -> Path:
    return cache_root() / "verified_files.json"


def _stat_key(path: Path) -> list[int]:
    stat = path.stat()
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino]


def _records() -> dict[str, list[int]]:
    try:
        records = json.loads(_record_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return records if isinstance(records, dict) else {}


def verified_unchanged(path: Path) -> bool:
    """Whether `path` is as it was when `remember_verified` last saw it."""
    try:
        return _records().get(str(path.resolve())) == _stat_key(path)
    except OSError:
        return False


def remember_verified(path: Path) -> None:
    """Record `path`, just checked whole. A cache that cannot be written only costs the
    check again next time."""
    try:
        records = {**_records(), str(path.resolve()): _stat_key(path)}
        target = _record_file()
        target.parent.mkdir(parents=True, exist_ok=True)
        # Written whole and renamed: two processes recording at once never leave a torn file.
        handle, tmp = tempfile.mkstemp(prefix=target.name, dir=target.parent)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(records, out)
            os.replace(tmp, target)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError:
        pass
