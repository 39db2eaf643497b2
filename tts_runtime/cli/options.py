"""Commands whose options are the run configuration's fields.

`config_command` registers `fn(run: RunConfig, **knobs)`: the typer options are generated from
RunConfig's option fields (tts_runtime/options.py: name, type, default, help, panel), plus
`--config FILE`, plus fn's own parameters (a benchmark's rounds, variants ...). A value comes
from, last one winning: the field's default (or the command's `defaults`), the config file,
the command line. The RunConfig is validated before fn runs.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from tts_runtime.cli.common import command
from tts_runtime.config import ConfigError
from tts_runtime.options import OptionField, coerce, option_fields, option_values, with_options
from tts_runtime.runs.config_file import config_options, read_config_file
from tts_runtime.runs.run_config import RunConfig
from tts_runtime.runs.run_folder import CONFIG_FILE, latest_config

# Panels in --help, after the common options (those without a panel).
PANELS = ("Search details", "search-and-learn", "Dataset", "Models", "Memory", "Engine", "Scheduler", "Co-hosting", "Kernels",
          "Pipeline", "Scale-out (Ray)")
_CONFIG_HELP = ("YAML or JSON file of options (keys: option names, or a run folder's config.json); "
                "options given on the command line override it.")


def config_command(parent: typer.Typer, name: str, *, only: Iterable[str] | None = None,
                   defaults: dict[str, Any] | None = None, fixed: dict[str, Any] | None = None,
                   plan: type | tuple[type, ...] | None = None) -> Callable[[Callable], Callable]:
    """Register `fn(run, **knobs)` (with `plan`: `fn(run, settings, **knobs)`) as `parent`'s command `name`.

    `only`: the option fields this command takes (default: all); `defaults`: the command's own
    defaults for some of them; `fixed`: values the command sets and the user cannot (a
    config file that sets them otherwise is an error); `plan`: a dataclass of the command's
    own settings (a benchmark's rounds, variants ...), declared with `option(...)` like the run
    configuration's: its option fields become options too, and fn gets their values by field
    name (`settings`) to build it with; a tuple of dataclasses gives a tuple of such dicts."""
    fixed = fixed or {}
    base = with_options(RunConfig(), {**(defaults or {}), **fixed})
    fields = option_fields(RunConfig)
    chosen = [fields[flag] for flag in (only if only is not None else fields) if flag not in fixed]
    chosen.sort(key=lambda spec: -1 if spec.spec.panel is None else PANELS.index(spec.spec.panel))
    shown = option_values(base)
    plans = plan if isinstance(plan, tuple) else (plan,) if plan is not None else ()
    planned = [option_fields(cls, nested=False) for cls in plans]

    def register(fn: Callable) -> Callable:
        knobs = list(inspect.signature(fn, eval_str=True).parameters.values())[2 if plans else 1:]

        def run(ctx: typer.Context, config: Optional[Path] = None, **values: Any) -> Any:
            own = {knob.name: values.pop(knob.name) for knob in knobs}
            settings = tuple({spec.path[-1]: coerce(spec, values.pop(flag)) for flag, spec in fields.items()}
                             for fields in planned)
            given = {flag: value for flag, value in values.items() if _given(ctx, flag)}
            stored = (read_config_file(config), config) if config is not None else _started_with(given, fixed)
            from_file, source = stored if stored is not None else ({}, None)
            run_config = compose(base, from_file, source, given, {spec.flag for spec in chosen}, fixed)
            if not plans:
                return fn(run_config, **own)
            return fn(run_config, settings if isinstance(plan, tuple) else settings[0], **own)

        parameters = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
                      inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, default=None,
                                        annotation=Annotated[Optional[Path], typer.Option(help=_CONFIG_HELP)])]
        parameters += [_parameter(spec, shown[spec.flag]) for spec in chosen]
        parameters += [_parameter(spec, spec.default) for fields in planned for spec in fields.values()]
        parameters += [knob.replace(kind=inspect.Parameter.KEYWORD_ONLY) for knob in knobs]
        run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        run.__doc__ = fn.__doc__
        run.__name__ = fn.__name__
        command(parent, name)(run)
        return fn
    return register


def compose(base: RunConfig, from_file: dict[str, Any], source: Path | None, given: dict[str, Any],
            allowed: set[str], fixed: dict[str, Any]) -> RunConfig:
    """The command's RunConfig: `base` (defaults and fixed values), then the options read from
    `source` (a config file, or a resumed run's), then the ones given on the command line;
    validated."""
    _check_fixed(from_file, fixed, source)
    from_file = {flag: value for flag, value in from_file.items() if flag not in fixed}
    settings = with_options(base, {**_take(from_file, allowed, source), **given})
    settings.validate()
    return settings


def _started_with(given: dict[str, Any], fixed: dict[str, Any]) -> tuple[dict[str, Any], Path] | None:
    """With `--resume --out RUN` and no --config, the options RUN's last session ran with
    (history.jsonl, else config.json): the run continues with them, not with this command's
    defaults (options given on the command line still override them, and the run folder
    refuses those that would change results). None where RUN records no configuration."""
    if not given.get("resume") or given.get("out") is None:
        return None
    run = Path(given["out"])
    config = latest_config(run)
    if config is None:
        return None
    search = config.get("search")
    method = search.get("method") if isinstance(search, dict) else None
    if "method" in fixed and method not in (None, fixed["method"]):
        raise ConfigError(f"{run} holds a {method} run, not a {fixed['method']} one: resume it with "
                          f"`tts {method} --resume --out {run}`")
    return config_options(config, run / CONFIG_FILE), run / CONFIG_FILE


def _given(ctx: typer.Context, flag: str) -> bool:
    """Whether the user set `flag` (command line or environment), not its default. By name:
    typer may carry its own copy of click's ParameterSource enum."""
    source = ctx.get_parameter_source(flag)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def _parameter(spec: OptionField, default: Any) -> inspect.Parameter:
    """The typer parameter of one option field; parsed fields (sizes, lists) take text."""
    kind = spec.type
    if spec.spec.parse is not None:
        kind = Optional[str]
        default = _as_text(default)
    option = typer.Option(help=spec.spec.help, rich_help_panel=spec.spec.panel)
    return inspect.Parameter(spec.flag, inspect.Parameter.KEYWORD_ONLY, default=default,
                             annotation=Annotated[kind, option])


def _as_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def _check_fixed(from_file: dict[str, Any], fixed: dict[str, Any], source: Path | None) -> None:
    for flag, value in fixed.items():
        if flag in from_file and from_file[flag] != value:
            raise ConfigError(f"--config {source} sets {flag} to {from_file[flag]!r}, which this command fixes at "
                              f"{value!r}; use the command for {from_file[flag]!r} or drop the key")


def _take(from_file: dict[str, Any], allowed: set[str], source: Path | None) -> dict[str, Any]:
    """The file's options this command takes; others are an error, not silently dropped."""
    foreign = sorted(set(from_file) - allowed)
    if foreign:
        raise ConfigError(f"--config {source}: this command takes no {', '.join(foreign)}")
    return from_file
