"""How a config field becomes a command-line option and a config-file key.

A config dataclass declares each user-facing field with `option(...)`: its default, its help,
the help panel it is listed under and, where they differ from the field, its flag and how the
option's text (or a config file's value) becomes the field's value. The CLI builds every
typer option from these declarations (tts_runtime/cli/options.py), so a new option is one
field. Fields declared with plain `field()` are internal: set by the runtime, never by a user.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field
from typing import Any

OPTION_KEY = "tts_option"


class ConfigError(ValueError):
    """A user-facing configuration mistake; the CLI prints it as one line."""


@dataclass(frozen=True)
class OptionSpec:
    help: str
    panel: str | None = None  # None: one of the common options, listed first
    flag: str | None = None  # the option's name (underscores) where it is not the field's
    # Option text or config-file value -> the field's value (sizes, comma lists); with it the
    # option is typed `str` on the command line.
    parse: Callable[[Any], Any] | None = None
    at_least: int | None = None  # a number's smallest allowed value (counts: rounds, prompts ...)


def option(default: Any = MISSING, help: str = "", *, default_factory: Any = MISSING, panel: str | None = None,
           flag: str | None = None, parse: Callable[[Any], Any] | None = None, at_least: int | None = None) -> Any:
    """A dataclass field that is also a user option (see the module doc)."""
    metadata = {OPTION_KEY: OptionSpec(help, panel, flag, parse, at_least)}
    return field(default=default, default_factory=default_factory, metadata=metadata)


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000 ** 2, "mb": 1000 ** 2,
          "mib": 1 << 20, "g": 1000 ** 3, "gb": 1000 ** 3, "gib": 1 << 30, "t": 1000 ** 4,
          "tb": 1000 ** 4, "tib": 1 << 40}
_LARGEST = 1 << 60  # 1 EiB: past any device, and still exact as an int


def parse_size(text: str | int) -> int:
    """'6GiB', '512MiB', '1.5GB', '2e9', 6442450944 -> bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+]?[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(f"cannot read memory size '{text}'; write e.g. 6GiB, 512MiB or 8GB")
    size = float(match.group(1)) * _UNITS[unit]
    if not math.isfinite(size) or size >= _LARGEST:
        raise ConfigError(f"memory size '{text}' is too large to be a device's memory; write e.g. 6GiB or 80GB")
    return int(size)


def parse_optional_size(text: str | int | None) -> int | None:
    return None if text is None else parse_size(text)


def comma_list(cast: Callable[[str], Any], what: str) -> Callable[[Any], tuple | None]:
    """A parser of '1,2,3' (or a config file's list) into a tuple of `cast` values."""
    def parse(value: Any) -> tuple | None:
        if value is None:
            return None
        items = value if isinstance(value, (list, tuple)) else str(value).split(",")
        try:
            return tuple(cast(str(item).strip()) for item in items if str(item).strip())
        except ValueError:
            raise ConfigError(f"--{what} takes a comma-separated list, e.g. 1,2,3; got '{value}'") from None
    return parse


@dataclass(frozen=True)
class OptionField:
    """One user option of a (nested) config dataclass: where its value lands."""

    flag: str
    path: tuple[str, ...]  # field names from the outer config down to this field
    spec: OptionSpec
    type: Any  # the field's resolved annotation
    default: Any  # the class's default


def option_fields(cls: type, prefix: tuple[str, ...] = (), *, nested: bool = True) -> dict[str, OptionField]:
    """Every option field of `cls` and (`nested`) of the config dataclasses nested in it, by flag."""
    namespace = vars(sys.modules[cls.__module__])
    found: dict[str, OptionField] = {}
    for item in dataclasses.fields(cls):
        spec = item.metadata.get(OPTION_KEY)
        if spec is None and not nested:
            continue
        # Only these annotations are evaluated: a field's type may name a class its module
        # imports for type checking only (one that would pull in Ray, say).
        kind = eval(item.type, namespace) if isinstance(item.type, str) else item.type  # noqa: S307
        if spec is not None:
            flag = spec.flag or item.name
            default = item.default if item.default is not MISSING else item.default_factory()
            found[flag] = OptionField(flag, (*prefix, item.name), spec, kind, default)
        elif dataclasses.is_dataclass(kind):
            nested = option_fields(kind, (*prefix, item.name))
            clash = found.keys() & nested.keys()
            if clash:
                raise TypeError(f"option flags {sorted(clash)} appear twice in {cls.__name__}")
            found.update(nested)
    return found


def option_values(config: Any) -> dict[str, Any]:
    """The current value of every option field of `config`, by flag."""
    values = {}
    for flag, spec in option_fields(type(config)).items():
        value = config
        for name in spec.path:
            value = getattr(value, name)
        values[flag] = value
    return values


def with_options(config: Any, values: dict[str, Any]) -> Any:
    """`config` with the named options set. Values may be option text or a config file's
    values: each is parsed or checked against its field's type, and the dataclasses'
    own checks run as they are rebuilt, so a bad value is one ConfigError."""
    known = option_fields(type(config))
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                          "see --help for the option names")
    by_path: dict[tuple[str, ...], Any] = {known[flag].path: coerce(known[flag], value)
                                           for flag, value in values.items()}
    return _replace(config, (), by_path)


def _replace(config: Any, prefix: tuple[str, ...], by_path: dict[tuple[str, ...], Any]) -> Any:
    changes = {}
    for item in dataclasses.fields(config):
        path = (*prefix, item.name)
        if path in by_path:
            changes[item.name] = by_path[path]
        elif any(key[:len(path)] == path for key in by_path):
            changes[item.name] = _replace(getattr(config, item.name), path, by_path)
    return dataclasses.replace(config, **changes) if changes else config


def coerce(spec: OptionField, value: Any) -> Any:
    """Option text or a config file's value -> the field's value (parsed, or checked against its type)."""
    if spec.spec.parse is not None:
        return spec.spec.parse(value)
    kinds = [kind for kind in typing.get_args(spec.type) if kind is not type(None)] or [spec.type]
    if value is None and type(None) in typing.get_args(spec.type):
        return None
    kind = kinds[0]
    flag = "--" + spec.flag.replace("_", "-")
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{flag} takes true or false, got {value!r}")
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{flag} takes a number, got {value!r}")
        try:
            number = kind(value)
        except ValueError:
            raise ConfigError(f"{flag} takes {'an integer' if kind is int else 'a number'}, got {value!r}") from None
        if kind is int and isinstance(value, float) and value != number:
            raise ConfigError(f"{flag} takes an integer, got {value!r}")
        if spec.spec.at_least is not None and number < spec.spec.at_least:
            raise ConfigError(f"{flag} must be >= {spec.spec.at_least}, got {number}")
        return number
    if kind is str and not isinstance(value, str):
        raise ConfigError(f"{flag} takes text, got {value!r}")
    return value
