import json
import os
import re
from pathlib import Path

import pytest

from tts_runtime.config import ConfigError
from tts_runtime.runs.datasets import DatasetConfig, DatasetError, Problem, load_problems

from tests.helpers import REPO_ROOT, shared_data_dir


DATA_DIR = shared_data_dir()
MATH500 = DATA_DIR / "math500" / "test.jsonl"
needs_math500 = pytest.mark.skipif(not MATH500.is_file(), reason=f"no MATH-500 copy at {MATH500}")


@pytest.fixture
def data_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTS_DATA_DIR", str(DATA_DIR))


@needs_math500
def test_math500_from_data_dir(data_env: None) -> None:
    problems = load_problems(DatasetConfig())
    assert len(problems) == 500
    first = problems[0]
    assert first.id == "test/precalculus/807.json"
    assert first.subject == "Precalculus"
    assert first.level == 2
    assert first.answer == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert first.question.startswith("Convert the point $(0,3)$")
    assert {p.level for p in problems} == {1, 2, 3, 4, 5}
    assert len({p.id for p in problems}) == 500


@needs_math500
def test_math500_explicit_path_file_and_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TTS_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from_file = load_problems(DatasetConfig(dataset_path=str(MATH500), limit=3))
    from_data_dir = load_problems(DatasetConfig(dataset_path=str(DATA_DIR), limit=3))
    from_folder = load_problems(DatasetConfig(dataset_path=str(MATH500.parent), limit=3))
    assert from_file == from_data_dir == from_folder
    assert len(from_file) == 3


@needs_math500
def test_math500_filters(data_env: None) -> None:
    all_problems = load_problems(DatasetConfig())
    assert load_problems(DatasetConfig(limit=5)) == all_problems[:5]

    level5 = load_problems(DatasetConfig(levels=(5,)))
    assert level5 and all(p.level == 5 for p in level5)
    assert load_problems(DatasetConfig(levels=(5,), limit=4)) == level5[:4]

    wanted = {all_problems[10].id, all_problems[3].id}
    picked = load_problems(DatasetConfig(ids=tuple(wanted)))
    assert [p.id for p in picked] == [all_problems[3].id, all_problems[10].id]  # file order
    with pytest.raises(DatasetError, match="--ids entries that match no problem: no/such/id"):
        load_problems(DatasetConfig(ids=tuple(wanted | {"no/such/id"})))  # a typo is not a smaller selection

    # ids, then levels, then limit
    mixed = load_problems(DatasetConfig(ids=tuple({p.id for p in all_problems[:50]}), levels=(1, 2), limit=2))
    expected = [p for p in all_problems[:50] if p.level in {1, 2}][:2]
    assert mixed == expected


def test_custom_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    rows = [
        {"problem": "1+1?", "answer": "2", "unique_id": "a", "level": 1, "subject": "Arithmetic"},
        {"problem": "2+2?", "answer": "4"},
        {"problem": "3+3?", "answer": "6", "level": "Level 3"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    problems = load_problems(DatasetConfig(dataset=str(path)))
    assert problems == [
        Problem(id="a", question="1+1?", answer="2", level=1, subject="Arithmetic"),
        Problem(id="1", question="2+2?", answer="4", level=None, subject=None),
        Problem(id="2", question="3+3?", answer="6", level=3, subject=None),
    ]
    assert load_problems(DatasetConfig(dataset=str(path), levels=(3,))) == [problems[2]]


def test_jsonl_missing_field_names_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps({"problem": "ok", "answer": "1"}) + "\n" + json.dumps({"problem": "no answer"}) + "\n")
    with pytest.raises(DatasetError, match=r"line 2.*'answer'"):
        load_problems(DatasetConfig(dataset=str(path)))


def test_jsonl_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "x", "answer": "1"}\n{not json\n')
    with pytest.raises(DatasetError, match="line 2"):
        load_problems(DatasetConfig(dataset=str(path)))


def test_an_empty_file_says_it_holds_no_problems(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(DatasetError, match=f"the dataset {re.escape(str(path))} holds no problems"):
        load_problems(DatasetConfig(dataset=str(path)))


def test_unknown_dataset_lists_known_names() -> None:
    with pytest.raises(DatasetError, match="math500") as info:
        load_problems(DatasetConfig(dataset="gsm8k-nope"))
    assert isinstance(info.value, ConfigError)
    assert "gsm8k-nope" in str(info.value)


def test_missing_local_copy_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TTS_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DatasetError) as info:
        load_problems(DatasetConfig())
    message = str(info.value)
    assert "TTS_DATA_DIR" in message and "--dataset-path" in message
    assert "\n" not in message


def test_data_dir_without_math500(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TTS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DatasetError, match=str(tmp_path)):
        load_problems(DatasetConfig())


def test_explicit_dataset_path_missing(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="--dataset-path"):
        load_problems(DatasetConfig(dataset_path=str(tmp_path / "nowhere")))


# --- selection checks ----------------------------------------------------------------

@pytest.mark.parametrize("fields, message", [
    ({"ids": ()}, "--ids is empty"),
    ({"levels": ()}, "--levels is empty"),
    ({"limit": 0}, "--limit must be >= 1, got 0"),
    ({"limit": -3}, "--limit must be >= 1, got -3"),
    ({"dataset_start": 5, "dataset_end": 2}, r"--dataset-start \(5\) must be below --dataset-end \(2\)"),
    ({"dataset_start": -1}, "--dataset-start must be >= 0"),
    ({"dataset_split": ""}, "--dataset-split is empty"),
    ({"dataset": "mine.jsonl", "dataset_path": "/x"}, "--dataset-path is a local MATH-500 copy"),
])
def test_bad_selection_is_one_line(fields: dict, message: str) -> None:
    with pytest.raises(DatasetError, match=message) as info:
        DatasetConfig(**fields)
    assert "\n" not in str(info.value)


def test_math500_has_no_other_split() -> None:
    with pytest.raises(DatasetError, match="math500 is MATH-500's test split"):
        load_problems(DatasetConfig(dataset_split="train"))


@needs_math500
def test_start_end_slice_before_the_filters(data_env: None) -> None:
    all_problems = load_problems(DatasetConfig())
    assert load_problems(DatasetConfig(dataset_start=10, dataset_end=20)) == all_problems[10:20]
    assert load_problems(DatasetConfig(dataset_start=495)) == all_problems[495:]
    assert load_problems(DatasetConfig(dataset_end=3)) == all_problems[:3]
    assert load_problems(DatasetConfig(dataset_start=10, dataset_end=20, limit=2)) == all_problems[10:12]
    outside = all_problems[0].id
    with pytest.raises(DatasetError, match="--ids entries that match no problem"):
        load_problems(DatasetConfig(dataset_start=10, dataset_end=20, ids=(outside,)))
    with pytest.raises(DatasetError, match=r"--dataset-start/--dataset-end select none of the dataset's 500 problems"):
        load_problems(DatasetConfig(dataset_start=600))


def test_column_names(tmp_path: Path) -> None:
    path = tmp_path / "renamed.jsonl"
    path.write_text(json.dumps({"question": "1+1?", "final": "2", "unique_id": "q1"}) + "\n")
    [problem] = load_problems(DatasetConfig(dataset=str(path), problem_column="question", answer_column="final"))
    assert (problem.id, problem.question, problem.answer) == ("q1", "1+1?", "2")
    with pytest.raises(DatasetError, match=r"missing string field 'problem' \(columns: final, question, "
                                           r"unique_id; name the right one with --problem-column\)"):
        load_problems(DatasetConfig(dataset=str(path)))


# --- Hub datasets, from a Hugging Face cache laid out on disk -------------------------

COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
_README_WITH_CONFIGS = """---
configs:
- config_name: low
  data_files:
  - split: test
    path: low/test.jsonl
- config_name: high
  data_files:
  - split: test
    path: high/test.jsonl
  - split: train
    path: high/train.jsonl
---
Two configs of MATH-500 rows, by level.
"""


def _lay_out_dataset(hub: Path, repo_id: str, files: dict[str, str]) -> None:
    """The real cache layout: datasets--org--name/{refs/main, snapshots/<commit>/...}."""
    repo = hub / ("datasets--" + repo_id.replace("/", "--"))
    for name, text in files.items():
        target = repo / "snapshots" / COMMIT / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)


def _jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def _load_offline(tmp_path: Path, calls: list[dict]) -> list:
    """Each DatasetConfig(**call) loaded in one fresh process with HF_HUB_OFFLINE=1 (huggingface_hub
    reads its environment once, at import): problems as lists, or the error's one line."""
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "from tts_runtime.runs.datasets import DatasetConfig, load_problems\n"
        "from tts_runtime.config import ConfigError\n"
        "out = []\n"
        "for call in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        out.append([[p.id, p.question, p.answer, p.level, p.subject]\n"
        "                    for p in load_problems(DatasetConfig(**call))])\n"
        "    except ConfigError as exc:\n"
        "        out.append(str(exc))\n"
        "print(json.dumps(out))\n")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets-cache"), "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(calls)], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@needs_math500
def test_hub_dataset_from_the_cache_offline(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in MATH500.read_text().splitlines()[:6]]
    renamed = [{"question": r["problem"], "final_answer": r["answer"], "unique_id": r["unique_id"]} for r in rows]
    low = [r for r in rows if r["level"] <= 2]
    high = [r for r in rows if r["level"] > 2]
    _lay_out_dataset(tmp_path / "hub", "demo-org/MATH-500-head", {"test.jsonl": _jsonl(rows)})
    _lay_out_dataset(tmp_path / "hub", "demo-org/MATH-500-renamed", {"data/test.jsonl": _jsonl(renamed)})
    _lay_out_dataset(tmp_path / "hub", "demo-org/MATH-500-levels", {
        "README.md": _README_WITH_CONFIGS, "low/test.jsonl": _jsonl(low),
        "high/test.jsonl": _jsonl(high), "high/train.jsonl": _jsonl(high[:1])})
    results = _load_offline(tmp_path, [
        {"dataset": "demo-org/MATH-500-head"},
        {"dataset": f"demo-org/MATH-500-head@{COMMIT}", "dataset_start": 2, "dataset_end": 5, "limit": 2},
        {"dataset": "demo-org/MATH-500-renamed", "problem_column": "question", "answer_column": "final_answer"},
        {"dataset": "demo-org/MATH-500-levels", "dataset_config": "high"},
        {"dataset": "demo-org/MATH-500-levels", "dataset_config": "high", "dataset_split": "train"},
        {"dataset": "demo-org/not-downloaded"},
        {"dataset": "demo-org/MATH-500-head", "dataset_split": "validation"},
        {"dataset": "demo-org/MATH-500-levels", "dataset_config": "middle"},
    ])
    expected = [[r["unique_id"], r["problem"], r["answer"], r["level"], r["subject"]] for r in rows]
    assert expected[0][:4] == ["test/precalculus/807.json", rows[0]["problem"],
                               "\\left( 3, \\frac{\\pi}{2} \\right)", 2]
    assert results[0] == expected
    assert results[1] == expected[2:4]
    assert results[2] == [[r[0], r[1], r[2], None, None] for r in expected]
    high_ids = [r["unique_id"] for r in high]
    assert [p[0] for p in results[3]] == high_ids and high_ids
    assert [p[0] for p in results[4]] == high_ids[:1]
    assert results[5].startswith("dataset demo-org/not-downloaded is not in the Hugging Face cache and the Hub "
                                 "cannot be reached")
    assert results[6].startswith("dataset demo-org/MATH-500-head: ") and "validation" in results[6]
    assert results[7].startswith("dataset demo-org/MATH-500-levels: ") and "middle" in results[7]
    assert all("\n" not in message for message in results[5:])
