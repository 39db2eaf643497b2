"""The run configuration: options generated from its fields, `--config` files, one validate()."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tests.helpers import REPO_ROOT
from tts_runtime.cli import app
from tts_runtime.cli.options import PANELS, compose
from tts_runtime.config import ConfigError
from tts_runtime.options import option_fields, with_options
from tts_runtime.runs.config_file import read_config_file
from tts_runtime.runs.run_config import RunConfig

FLAGS = set(option_fields(RunConfig))


def _help(*command: str) -> str:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_every_option_field_is_an_option_of_tts_beam_with_its_default():
    text = _help("beam")
    for flag in FLAGS - {"method"}:  # the command names the method
        assert f"--{flag.replace('_', '-')} " in text, flag
    assert "[default: 0.3]" in text and "[default: 40]" in text  # the split and the iteration cap, from the fields
    # The common options come first, the rest in panels (typer's rich_help_panel).
    assert text.index("--n ") < text.index("Search details") < text.index("--top-p")
    assert all(panel in text for panel in ("Kernels", "Pipeline", "Co-hosting"))
    assert all(spec.spec.panel in (None, *PANELS) for spec in option_fields(RunConfig).values())


def test_a_benchmark_takes_its_own_defaults_for_the_fields_it_shares():
    text = _help("bench", "cohost")
    assert "--max-step-tokens" in text and "[default: 96]" in text and "--rounds" in text
    assert "--overlap " not in text  # a field the benchmark varies itself is not its option
    # Its own settings are the option fields of its bench dataclass, like the run's.
    assert "--variants" in text and "[default: 2]" in text
    engine = _help("bench", "engine")
    assert all(f"--{flag} " in engine for flag in ("num-prompts", "dtypes", "beam-new-tokens", "workload"))


def test_flat_and_nested_files_give_the_same_configuration(tmp_path):
    flat = tmp_path / "flat.yaml"
    flat.write_text("n: 8\nbeam-width: 2\nmemory_split: 0.4\ndevice_memory: 3GiB\nlevels: [1, 2]\n"
                    "scheduler_policy: throttle\npp_layers: '1'\n")
    nested = tmp_path / "nested.json"
    nested.write_text(json.dumps({"search": {"n": 8, "beam_width": 2}, "memory": {"prm_fraction": 0.4,
                                  "device_memory": 3 << 30}, "dataset": {"levels": [1, 2]},
                                  "engine": {"scheduler": {"policy": "throttle"}, "parallel": {"pp_layers": [1]}}}))
    first = with_options(RunConfig(), read_config_file(flat))
    assert first == with_options(RunConfig(), read_config_file(nested))
    assert (first.search.n, first.search.beam_width, first.memory.prm_fraction) == (8, 2, 0.4)
    assert first.memory.device_memory == 3 << 30 and first.dataset.levels == (1, 2)
    assert first.engine.scheduler.policy == "throttle" and first.engine.parallel.pp_layers == (1,)


def test_a_run_folders_config_json_reads_back_as_the_same_run_configuration(tmp_path):
    run = with_options(RunConfig(), {"n": 8, "beam_width": 2, "ids": "test/a.json,test/b.json", "cascade": False,
                                     "host_kv_memory": "1GiB", "out": "runs/x"})
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**run.to_dict(), "resolved": {"dtype": "torch.float32"}, "command": ["tts"]}))
    assert with_options(RunConfig(), read_config_file(path)) == run


def test_the_command_line_overrides_the_file_which_overrides_the_defaults(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("n: 8\nbeam_width: 4\ntemperature: 0.5\n")
    run = compose(RunConfig(), read_config_file(recipe), recipe, {"n": 16}, FLAGS, {"method": "beam"})
    assert (run.search.n, run.search.beam_width, run.search.temperature, run.search.resolved().seed) == (16, 4, 0.5, 42)


@pytest.mark.parametrize("text, fragment", [
    ("n: 8\nbeams: 3\n", "unknown key 'beams'"),
    ("search: {n: 8, width: 2}\n", "unknown key 'search.width'"),
    ("n: [1\n", "is not valid YAML"),
    ("- n\n", "must hold a mapping"),
    ("n: eight\n", "--n takes an integer, got 'eight'"),
    ("filter_duplicates: 'yes'\n", "--filter-duplicates takes true or false"),
    ("n: 6\nbeam_width: 4\n", "n (6) must be a multiple of the beam width (4)"),
    ("method: bon\n", "fixes at 'beam'"),
    ("memory_policy: elastic\noverlap: true\n", "--overlap runs each engine's forward in a worker"),
])
def test_a_bad_config_file_is_one_line(tmp_path, text, fragment):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=None) as caught:
        compose(RunConfig(), read_config_file(recipe), recipe, {}, FLAGS - {"method"}, {"method": "beam"})
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_tts_beam_reads_the_file_and_the_command_line_on_top_of_it(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("n: 6\nbeam_width: 3\n")
    for args, fragment in [([], None), (["--beam-width", "4"], "n (6) must be a multiple of the beam width (4)"),
                           (["--n", "8"], "n (8) must be a multiple of the beam width (3)")]:
        # An unknown dataset stops the valid combination right after the configuration is built.
        result = CliRunner().invoke(app, ["beam", "--config", str(recipe), "--dataset", "gsm0k", *args])
        assert result.exit_code == 2, result.output
        assert fragment in result.output if fragment else "unknown dataset 'gsm0k'" in result.output


def test_a_missing_config_file_is_a_one_line_cli_error(tmp_path):
    result = CliRunner().invoke(app, ["beam", "--config", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and result.output.strip() == f"error: --config {tmp_path / 'nope.yaml'}: no such file"


def test_cross_part_checks_live_in_validate():
    for options, fragment in [({"resume": True}, "--resume needs --out"),
                              ({"backend": "vllm", "replicas": 2}, "--backend vllm"),
                              ({"host_kv_memory": "1GiB", "overlap": True}, "--host-kv-memory needs the KV cache"),
                              ({"dtype": "int4"}, "unknown dtype 'int4'"),
                              ({"device": "tpu"}, "unknown device 'tpu'"),
                              ({"device": "cpu", "device_memory": "100000GiB"},
                               "is more than this machine has in all"),
                              # Its KV is a model's, but terabytes of it would be billions of blocks.
                              ({"device": "sim", "device_memory": "100000GiB"},
                               r"is more than the simulated device has in all \(79.65 GiB\)")]:
        with pytest.raises(ConfigError, match=fragment):
            with_options(RunConfig(), options).validate()
    # A Ray cluster's replicas run on its nodes, whose memory is not this machine's to judge;
    # the simulated device's is its own, not this machine's.
    for options in ({"device": "cpu", "device_memory": "100000GiB", "ray_address": "head:6379"},
                    {"device": "sim", "device_memory": "79GiB"}):
        with_options(RunConfig(), options).validate()


@pytest.mark.slow
def test_tts_beam_runs_a_config_file_and_its_run_folder_reruns_from_config_json(tmp_path, math500_path):
    recipe = tmp_path / "small.yaml"
    recipe.write_text("n: 2\nbeam_width: 2\nnum_iterations: 2\nmax_step_tokens: 32\nmax_tokens: 48\n"
                      "device_memory: 3GiB\nlimit: 1\n")
    first = tmp_path / "first"
    base = [sys.executable, "-m", "tts_runtime.cli", "beam", "--dataset-path", str(math500_path)]
    done = subprocess.run([*base, "--config", str(recipe), "--seed", "7", "--out", str(first)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((first / "config.json").read_text())
    assert (config["search"]["n"], config["search"]["seed"], config["dataset"]["limit"]) == (2, 7, 1)
    second = tmp_path / "second"
    again = subprocess.run([*base, "--config", str(first / "config.json"), "--out", str(second)],
                           capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    rows = [[{key: row[key] for key in ("id", "prediction", "beams")}
             for row in map(json.loads, (folder / "results.jsonl").read_text().splitlines())]
            for folder in (first, second)]
    assert rows[0] == rows[1]
    assert json.loads((second / "config.json").read_text())["search"] == config["search"]
    # A resume that would change results is refused before any model loads.
    changed = subprocess.run([*base, "--config", str(recipe), "--seed", "8", "--out", str(first), "--resume"],
                             capture_output=True, text=True, timeout=300)
    assert changed.returncode == 2 and "loading" not in changed.stderr
    refusal = changed.stderr.strip().splitlines()[-1]
    assert refusal.startswith(f"error: cannot resume {first}: its settings differ from this command's")
    assert "search.seed: 7 -> 8" in refusal and "resolved.seed: 7 -> 8" in refusal


RECIPES = sorted(REPO_ROOT.glob("recipes/*/*.yaml"))
COMMANDS = {"beam_search": "beam", "best_of_n": "bon", "dvts": "dvts"}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_every_shipped_recipe_is_a_valid_configuration_of_its_command(recipe):
    method = COMMANDS[recipe.stem]
    run = compose(with_options(RunConfig(), {"method": method}), read_config_file(recipe), recipe, {},
                  FLAGS - {"method"}, {"method": method})
    assert run.search.method == method and run.models.generator.startswith("meta-llama/Llama-3.2-")
    other = next(command for command in COMMANDS.values() if command != method)
    with pytest.raises(ConfigError, match="fixes at"):
        compose(RunConfig(), read_config_file(recipe), recipe, {}, FLAGS - {"method"}, {"method": other})


def test_a_search_and_learn_recipe_file_loads_unchanged(tmp_path):
    recipe = tmp_path / "beam_search.yaml"  # S&L's keys, as its recipes/ write them
    recipe.write_text("approach: beam_search\nn: 4\nbeam_width: 4\nnum_iterations: 40\nseed: 0\n"
                      "model_path: meta-llama/Llama-3.2-1B-Instruct\nprm_path: RLHFlow/Llama3.1-8B-PRM-Deepseek-Data\n"
                      "search_batch_size: 25\nnum_samples: 10\nsort_completed: false\nfilter_duplicates: true\n")
    run = compose(with_options(RunConfig(), {"method": "beam"}), read_config_file(recipe), recipe, {},
                  FLAGS - {"method"}, {"method": "beam"})
    assert (run.search.n, run.search.resolved().seed, run.dataset.limit) == (4, 0, 10)
    assert run.models.prm == "RLHFlow/Llama3.1-8B-PRM-Deepseek-Data"


@pytest.mark.slow
def test_a_shipped_recipe_runs_on_the_demo_models(tmp_path, math500_path):
    """The Llama-3.2-1B beam-search recipe as tts runs it, on the demo pair and a tiny budget."""
    out = tmp_path / "run"
    command = [sys.executable, "-m", "tts_runtime.cli", "beam", "--config",
               str(next(path for path in RECIPES if path.match("Llama-3.2-1B-Instruct/beam_search.yaml"))),
               "--generator", "smollm2-135m-instruct", "--prm", "gemma3-270m", "--dataset-path", str(math500_path),
               "--limit", "1", "--num-iterations", "2", "--max-step-tokens", "32", "--max-tokens", "48",
               "--device-memory", "3GiB", "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    config = json.loads((out / "config.json").read_text())
    assert config["resolved"]["seed"] == 0 and config["search"]["filter_duplicates"] is True
    assert len((out / "results.jsonl").read_text().splitlines()) == 1
