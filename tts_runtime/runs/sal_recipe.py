"""search-and-learn (S&L) recipe files, read as they are: each key of S&L's `Config`
(src/sal/config.py) mapped to our flat option names (`tts beam --help`, underscores), or
accepted and ignored where it does not apply here; any other key is refused.

An S&L recipe means "S&L's defaults, with these keys changed", so where an S&L default
differs from ours and the recipe leaves the key out, the translation states S&L's value
(`SAL_DEFAULTS`): its Llama-3.2-1B recipes name no model, and its `filter_duplicates` is off
by default (ours is on).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from tts_runtime.config import ConfigError

_APPROACHES = {"beam_search": "beam", "best_of_n": "bon", "dvts": "dvts"}
_MATH500 = "HuggingFaceH4/MATH-500"

# S&L key -> our option, where only the name changes.
RENAMED: dict[str, str] = {
    "model_path": "generator",
    "prm_path": "prm",
    "output_dir": "out",  # S&L writes {approach}_completions.jsonl there; so does our run folder
    "n": "n",
    "temperature": "temperature",
    "top_p": "top_p",
    "seed": "seed",
    "agg_strategy": "aggregation",  # last, min, prod: the beam score; votes use the last step, as S&L
    "beam_width": "beam_width",
    "num_iterations": "num_iterations",
    "lookahead": "lookahead",
    "filter_duplicates": "filter_duplicates",
    "sort_completed": "sort_completed",
    "system_prompt": "system_prompt",
    "custom_chat_template": "chat_template",  # null: the tokenizer's own, as in S&L
    "dataset_config": "dataset_config",  # S&L's get_dataset drops it; we load that config
    "dataset_split": "dataset_split",
    "num_samples": "limit",  # after dataset_start/end, as S&L
}

# S&L keys with nothing to set here, and why.
IGNORED: dict[str, str] = {
    "gpu_memory_utilization": "vLLM's share of GPU memory; our planner sizes both models from --device-memory "
                              "and --memory-split",
    "prm_batch_size": "the PRM's HF batch size; our engine batches PRM requests by its token budget",
    "search_batch_size": "problems per S&L dataset.map batch (beam search needs 1 there); throughput only, "
                         "set --problem-batch for ours",
    "num_proc": "processes of S&L's scoring dataset.map; our votes are computed in the run",
    "apply_voting": "S&L's switch for the pred_* columns; our completions file always has them",
    "hub_dataset_id": "for push_to_hub, which we do not do",
    "hub_dataset_private": "for push_to_hub, which we do not do",
    "overwrite_hub_revision": "for push_to_hub, which we do not do",
    "push_to_hub": "false only: we do not push results to the Hub",
}

# S&L defaults that differ from ours, stated when a recipe leaves the key out.
SAL_DEFAULTS: dict[str, Any] = {
    "model_path": "meta-llama/Llama-3.2-1B-Instruct",
    "prm_path": "RLHFlow/Llama3.1-8B-PRM-Deepseek-Data",
    "filter_duplicates": False,
}

# Keys with a rule of their own (see `_SPECIAL`), besides the renamed and ignored ones.
_SPECIAL_KEYS = ("approach", "max_tokens", "dataset_name", "dataset_start", "dataset_end")
SAL_KEYS: frozenset[str] = frozenset(RENAMED) | frozenset(IGNORED) | frozenset(_SPECIAL_KEYS)
# Keys that are also our option names with the same meaning: a recipe of only these reads
# the same either way (max_tokens aside: S&L's caps each step too).
_SHARED = frozenset(key for key, name in RENAMED.items() if key == name) | {
    "max_tokens", "dataset_start", "dataset_end"}


def recipe_kind(raw: dict[str, Any]) -> Literal["sal", "tts"]:
    """Whether a recipe is S&L's ("sal": it has a key only S&L uses, e.g. `approach`,
    `model_path`) or written in our option names ("tts"). Mixing the two is refused."""
    sal_only = sorted(key for key in raw if key in SAL_KEYS and key not in _SHARED)
    if not sal_only:
        return "tts"
    ours = sorted(key for key in raw if key not in SAL_KEYS)
    if ours:
        raise ConfigError(f"recipe mixes search-and-learn keys ({', '.join(sal_only[:3])}) with tts option "
                          f"names ({', '.join(ours[:3])}); write it in one of the two")
    return "sal"


def is_sal_recipe(raw: dict[str, Any]) -> bool:
    return recipe_kind(raw) == "sal"


def translate_recipe(raw: dict[str, Any]) -> dict[str, Any]:
    """Our options for an S&L recipe's keys (with S&L's defaults where they differ from ours)."""
    unknown = [key for key in raw if key not in SAL_KEYS]
    if unknown:
        raise ConfigError(f"unknown search-and-learn recipe key '{unknown[0]}': not a field of S&L's Config "
                          "(src/sal/config.py); fix or remove it")
    recipe = {**{key: value for key, value in SAL_DEFAULTS.items() if key not in raw}, **raw}
    options: dict[str, Any] = {}
    for key, value in recipe.items():
        if key in RENAMED:
            options[RENAMED[key]] = value
        elif key in _SPECIAL:
            options.update(_SPECIAL[key](value, recipe))
        elif key == "push_to_hub" and value:
            raise ConfigError("push_to_hub: true is not supported: tts writes {approach}_completions.jsonl into "
                              "the run folder (--out); upload it yourself, and set push_to_hub: false")
    return options


def _approach(value: Any, recipe: dict[str, Any]) -> dict[str, Any]:
    if value not in _APPROACHES:
        raise ConfigError(f"unknown search-and-learn approach '{value}'; choose one of {', '.join(_APPROACHES)}")
    return {"method": _APPROACHES[value]}


def _max_tokens(value: Any, recipe: dict[str, Any]) -> dict[str, Any]:
    # S&L caps every beam-search/DVTS step and a best-of-N completion with the same number.
    return {"max_step_tokens": value, "max_tokens": value}


def _dataset_name(value: Any, recipe: dict[str, Any]) -> dict[str, Any]:
    # Our `math500` is MATH-500's test split, from a local copy when there is one, else the Hub.
    plain = recipe.get("dataset_config") is None and recipe.get("dataset_split", "test") == "test"
    return {"dataset": "math500" if value == _MATH500 and plain else value}


def _slice(option: str) -> Callable[[Any, dict[str, Any]], dict[str, Any]]:
    def mapped(value: Any, recipe: dict[str, Any]) -> dict[str, Any]:
        # S&L slices only when both ends are set and silently ignores one alone.
        if (recipe.get("dataset_start") is None) != (recipe.get("dataset_end") is None):
            raise ConfigError("search-and-learn uses dataset_start and dataset_end only together (one alone "
                              "is ignored there); give both or neither")
        return {option: value}
    return mapped


_SPECIAL: dict[str, Callable[[Any, dict[str, Any]], dict[str, Any]]] = {
    "approach": _approach, "max_tokens": _max_tokens, "dataset_name": _dataset_name,
    "dataset_start": _slice("dataset_start"), "dataset_end": _slice("dataset_end"),
}
