"""search-and-learn recipe keys translated to our options, and the shipped recipes/.

The S&L recipes below are test data written from the keys of S&L's recipe files (its
repository is not part of CI): the six Llama-3.2 ones, whose translations must equal our
shipped equivalents, and the Qwen2.5 and AceMath shapes (custom_chat_template: null, a
Qwen PRM)."""

from __future__ import annotations

from dataclasses import fields

import pytest
import yaml

from tests.helpers import REPO_ROOT
from search.config import SearchConfig
from tts_runtime.config import ConfigError
from tts_runtime.runs.datasets import DatasetConfig
from tts_runtime.runs.sal_recipe import IGNORED, SAL_KEYS, recipe_kind, translate_recipe

RECIPES = REPO_ROOT / "recipes"
# Our option names a recipe may use: the run configuration's fields, the model and run-folder
# options, and the search-semantics options added beside this work.
OPTION_NAMES = ({f.name for f in fields(SearchConfig)} | {f.name for f in fields(DatasetConfig)}
                | {"generator", "prm", "out", "lookahead", "sal_exact"})

SAL_LLAMA_1B = {
    "beam_search": "filter_duplicates: true\napproach: beam_search\nn: 4\n"
                   "search_batch_size: 1  # DO NOT CHANGE!\nnum_samples: 10\nseed: 0",
    "best_of_n": "approach: best_of_n\nn: 4\nsearch_batch_size: 25\nsort_completed: true\n"
                 "filter_duplicates: true\nnum_samples: 10\nseed: 0\n",
    "dvts": "approach: dvts\nn: 4\nsearch_batch_size: 25\nnum_samples: 10\nseed: 0\n",
}
SAL_LLAMA_3B = {name: "model_path: meta-llama/Llama-3.2-3B-Instruct\n" + text for name, text in SAL_LLAMA_1B.items()}
SAL_QWEN_BEAM = ("model_path: Qwen/Qwen2.5-1.5B-Instruct\ncustom_chat_template: null\nfilter_duplicates: true\n"
                 "approach: beam_search\nn: 4\nsearch_batch_size: 1\nnum_samples: 10\nseed: 0")
SAL_ACEMATH_BON = ("model_path: nvidia/AceMath-7B-Instruct\nprm_path: Qwen/Qwen2.5-Math-PRM-7B\n"
                   "custom_chat_template: null\napproach: best_of_n\nn: 4\nsearch_batch_size: 25\n"
                   "sort_completed: true\nfilter_duplicates: true\nnum_samples: 10\nseed: 0\n")

# Every field of S&L's Config with a value of its type (S&L's own defaults).
EVERY_SAL_KEY = {
    "approach": "beam_search", "model_path": "meta-llama/Llama-3.2-1B-Instruct", "gpu_memory_utilization": 0.5,
    "prm_path": "RLHFlow/Llama3.1-8B-PRM-Deepseek-Data", "output_dir": None, "num_proc": None,
    "push_to_hub": False, "hub_dataset_id": None, "hub_dataset_private": False, "overwrite_hub_revision": False,
    "apply_voting": True, "dataset_name": "HuggingFaceH4/MATH-500", "dataset_config": None,
    "dataset_split": "test", "dataset_start": None, "dataset_end": None, "num_samples": None,
    "system_prompt": "Solve it.", "custom_chat_template": "{{ messages[0]['content'] }}", "n": 4,
    "temperature": 0.8, "top_p": 1.0, "prm_batch_size": 4, "search_batch_size": 1, "seed": 42,
    "max_tokens": 2048, "agg_strategy": "last", "beam_width": 4, "num_iterations": 40, "lookahead": 0,
    "filter_duplicates": False, "sort_completed": False,
}


def _shipped(model: str, name: str) -> dict:
    return yaml.safe_load((RECIPES / model / f"{name}.yaml").read_text())


@pytest.mark.parametrize("name", list(SAL_LLAMA_1B))
@pytest.mark.parametrize("model, sal", [("Llama-3.2-1B-Instruct", SAL_LLAMA_1B),
                                        ("Llama-3.2-3B-Instruct", SAL_LLAMA_3B)])
def test_sal_llama_recipes_translate_to_the_shipped_ones(model: str, sal: dict, name: str) -> None:
    raw = yaml.safe_load(sal[name])
    assert recipe_kind(raw) == "sal"
    assert translate_recipe(raw) == _shipped(model, name)


def test_every_shipped_recipe_uses_our_option_names() -> None:
    shipped = sorted(RECIPES.glob("*/*.yaml"))
    assert len(shipped) == 6
    for path in shipped:
        recipe = yaml.safe_load(path.read_text())
        assert recipe_kind(recipe) == "tts", path
        assert set(recipe) <= OPTION_NAMES, (path, set(recipe) - OPTION_NAMES)
        search = {key: value for key, value in recipe.items() if key in {f.name for f in fields(SearchConfig)}}
        SearchConfig(**search)  # valid values, not only valid names
        DatasetConfig(**{key: value for key, value in recipe.items() if key in {f.name for f in fields(DatasetConfig)}})


def test_qwen_and_acemath_shapes() -> None:
    qwen = translate_recipe(yaml.safe_load(SAL_QWEN_BEAM))
    assert qwen == {"generator": "Qwen/Qwen2.5-1.5B-Instruct", "prm": "RLHFlow/Llama3.1-8B-PRM-Deepseek-Data",
                    "chat_template": None, "filter_duplicates": True, "method": "beam", "n": 4, "limit": 10,
                    "seed": 0}
    acemath = translate_recipe(yaml.safe_load(SAL_ACEMATH_BON))
    assert acemath["prm"] == "Qwen/Qwen2.5-Math-PRM-7B" and acemath["method"] == "bon"
    assert acemath["sort_completed"] is True and acemath["chat_template"] is None


def test_every_sal_config_key_has_a_rule() -> None:
    assert set(EVERY_SAL_KEY) == SAL_KEYS
    options = translate_recipe(EVERY_SAL_KEY)
    assert set(options) <= OPTION_NAMES
    assert options == {
        "method": "beam", "generator": "meta-llama/Llama-3.2-1B-Instruct",
        "prm": "RLHFlow/Llama3.1-8B-PRM-Deepseek-Data", "out": None, "dataset": "math500",
        "dataset_config": None, "dataset_split": "test", "dataset_start": None, "dataset_end": None,
        "limit": None, "system_prompt": "Solve it.", "chat_template": "{{ messages[0]['content'] }}", "n": 4,
        "temperature": 0.8, "top_p": 1.0, "seed": 42, "max_step_tokens": 2048, "max_tokens": 2048,
        "aggregation": "last", "beam_width": 4, "num_iterations": 40, "lookahead": 0,
        "filter_duplicates": False, "sort_completed": False,
    }
    assert not set(options) & set(IGNORED)


def test_dataset_keys() -> None:
    hub = translate_recipe({"dataset_name": "AI-MO/aimo-validation-aime", "dataset_split": "train",
                            "dataset_start": 0, "dataset_end": 50, "num_samples": 5})
    assert {key: hub[key] for key in ("dataset", "dataset_split", "dataset_start", "dataset_end", "limit")} == {
        "dataset": "AI-MO/aimo-validation-aime", "dataset_split": "train", "dataset_start": 0, "dataset_end": 50,
        "limit": 5}
    # MATH-500 with another split or a config stays a Hub dataset, not our local math500.
    assert translate_recipe({"dataset_name": "HuggingFaceH4/MATH-500", "dataset_config": "x"})["dataset"] == \
        "HuggingFaceH4/MATH-500"


@pytest.mark.parametrize("raw, message", [
    ({"approach": "beam_search", "beam_size": 4}, "unknown search-and-learn recipe key 'beam_size'"),
    ({"approach": "mcts"}, "unknown search-and-learn approach 'mcts'"),
    ({"dataset_start": 10}, "dataset_start and dataset_end only together"),
    ({"push_to_hub": True}, "push_to_hub: true is not supported"),
])
def test_refusals_are_one_line(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        translate_recipe(raw)
    assert "\n" not in str(info.value)


def test_recipe_kind() -> None:
    assert recipe_kind({"n": 8, "seed": 0}) == "tts"  # shared names read the same either way
    assert recipe_kind({"method": "beam", "generator": "x", "n": 8}) == "tts"
    assert recipe_kind({"approach": "dvts", "n": 8}) == "sal"
    with pytest.raises(ConfigError, match=r"recipe mixes search-and-learn keys \(approach\) with tts option "
                                          r"names \(generator\)"):
        recipe_kind({"approach": "dvts", "generator": "x"})
