"""`--config FILE`: options from a YAML or JSON file.

Three layouts are read: flat, one key per option (`n: 8`, `beam_width: 4`, `memory_split: 0.4`;
dashes or underscores); nested, the sections of a run folder's `config.json` (`search:`,
`dataset:`, `models:` ...), so a finished run's configuration can be run again; and
search-and-learn's recipe files as they are (`approach`, `model_path`, `prm_path` ...;
tts_runtime/runs/sal_recipe.py maps each key to our option). An unknown key is a one-line
error naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tts_runtime.config import ConfigError
from tts_runtime.options import option_fields
from tts_runtime.runs.run_config import RunConfig
from tts_runtime.runs.sal_recipe import is_sal_recipe, translate_recipe

# What a run folder's config.json records beside the configuration: read past, not options.
RECORD_KEYS = frozenset({"resolved", "fingerprints", "versions", "machine", "command"})


def read_config_file(path: Path) -> dict[str, Any]:
    """The file's options, by option name (flag with underscores)."""
    return config_options(_load(path), path)


def config_options(raw: dict[str, Any], source: Path) -> dict[str, Any]:
    """The options of a configuration in any of the three layouts; `source` names it in errors."""
    if is_sal_recipe(raw):
        return translate_recipe(raw)
    by_path = {spec.path: flag for flag, spec in option_fields(RunConfig).items()}
    options: dict[str, Any] = {}
    _flatten(raw, (), by_path, options, source)
    return options


def _load(path: Path) -> dict[str, Any]:
    if path.is_dir():
        # A recipes folder (ours or search-and-learn's) holds one file per method.
        files = sorted(p.name for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
        raise ConfigError(f"--config {path} is a folder; pass one of its files"
                          + (f": {', '.join(files)}" if files else " (it holds no .yaml or .json)"))
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc})") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"--config {path} is not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                          f"{first}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path} must hold a mapping of option names to values, not a "
                          f"{type(data).__name__}")
    return data


def _flatten(section: dict[str, Any], prefix: tuple[str, ...], by_path: dict[tuple[str, ...], str],
             options: dict[str, Any], source: Path) -> None:
    flags = set(by_path.values())
    for raw_key, value in section.items():
        key = str(raw_key).replace("-", "_")
        path = (*prefix, key)
        if not prefix and key in RECORD_KEYS:
            continue
        if isinstance(value, dict) and any(known[:len(path)] == path and len(known) > len(path) for known in by_path):
            _flatten(value, path, by_path, options, source)
        elif path in by_path:
            options[by_path[path]] = value
        elif not prefix and key in flags:
            options[key] = value
        else:
            raise ConfigError(f"--config {source}: unknown key '{'.'.join(path)}'; the keys are the option names "
                              "of `tts beam --help` (with _ for -)")
