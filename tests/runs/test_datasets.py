import json
from pathlib import Path

import pytest

from tts_runtime.config import ConfigError
from tts_runtime.runs.datasets import DatasetError, Problem, load_problems

from tests.helpers import shared_data_dir


DATA_DIR = shared_data_dir()
MATH500 = DATA_DIR / "math500" / "test.jsonl"
needs_math500 = pytest.mark.skipif(not MATH500.is_file(), reason=f"no MATH-500 copy at {MATH500}")


@pytest.fixture
def data_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTS_DATA_DIR", str(DATA_DIR))


@needs_math500
def test_math500_from_data_dir(data_env: None) -> None:
    problems = load_problems("math500")
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
    from_file = load_problems("math500", dataset_path=str(MATH500), limit=3)
    from_data_dir = load_problems("math500", dataset_path=str(DATA_DIR), limit=3)
    from_folder = load_problems("math500", dataset_path=str(MATH500.parent), limit=3)
    assert from_file == from_data_dir == from_folder
    assert len(from_file) == 3


@needs_math500
def test_math500_filters(data_env: None) -> None:
    all_problems = load_problems("math500")
    assert load_problems("math500", limit=5) == all_problems[:5]

    level5 = load_problems("math500", levels={5})
    assert level5 and all(p.level == 5 for p in level5)
    assert load_problems("math500", levels={5}, limit=4) == level5[:4]

    wanted = {all_problems[10].id, all_problems[3].id}
    picked = load_problems("math500", ids=wanted)
    assert [p.id for p in picked] == [all_problems[3].id, all_problems[10].id]  # file order
    with pytest.raises(DatasetError, match="--ids entries that match no problem: no/such/id"):
        load_problems("math500", ids=wanted | {"no/such/id"})  # a typo is not a smaller selection

    # ids, then levels, then limit
    mixed = load_problems("math500", ids={p.id for p in all_problems[:50]}, levels={1, 2}, limit=2)
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
    problems = load_problems(str(path))
    assert problems == [
        Problem(id="a", question="1+1?", answer="2", level=1, subject="Arithmetic"),
        Problem(id="1", question="2+2?", answer="4", level=None, subject=None),
        Problem(id="2", question="3+3?", answer="6", level=3, subject=None),
    ]
    assert load_problems(str(path), levels={3}) == [problems[2]]


def test_jsonl_missing_field_names_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps({"problem": "ok", "answer": "1"}) + "\n" + json.dumps({"problem": "no answer"}) + "\n")
    with pytest.raises(DatasetError, match=r"line 2.*'answer'"):
        load_problems(str(path))


def test_jsonl_invalid_json(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"problem": "x", "answer": "1"}\n{not json\n')
    with pytest.raises(DatasetError, match="line 2"):
        load_problems(str(path))


def test_unknown_dataset_lists_known_names() -> None:
    with pytest.raises(DatasetError, match="math500") as info:
        load_problems("gsm8k-nope")
    assert isinstance(info.value, ConfigError)
    assert "gsm8k-nope" in str(info.value)


def test_missing_local_copy_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TTS_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DatasetError) as info:
        load_problems("math500")
    message = str(info.value)
    assert "TTS_DATA_DIR" in message and "--dataset-path" in message
    assert "\n" not in message


def test_data_dir_without_math500(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TTS_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DatasetError, match=str(tmp_path)):
        load_problems("math500")


def test_explicit_dataset_path_missing(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="--dataset-path"):
        load_problems("math500", dataset_path=str(tmp_path / "nowhere"))
