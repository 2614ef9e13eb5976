import json
import sys
import types
from pathlib import Path

import pytest

from tandemrl.data.gsm8k import DatasetError, load_gsm8k

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


ROWS = [
    {"question": "What is 2+2?", "answer": "2+2=4\n#### 4"},
    {"question": "How many?", "answer": "lots\n#### 1,234"},
    {"question": "Owe?", "answer": "#### 1\n then #### -5 "},
]


def test_loads_directory_and_file(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    for source in (str(tmp_path), str(tmp_path / "train.jsonl")):
        samples = load_gsm8k(source, "train")
        assert [s.answer for s in samples] == ["4", "1234", "-5"]
        assert [s.index for s in samples] == [0, 1, 2]
        assert samples[0].prompt.startswith("What is 2+2?\n") and "####" in samples[0].prompt
        assert samples[0].columns == {"question": "What is 2+2?", "solution": "2+2=4\n#### 4"}
    assert len(load_gsm8k(str(tmp_path), "train", limit=2)) == 2


def test_blank_lines_are_skipped(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [ROWS[0], "", ROWS[1]])
    assert len(load_gsm8k(str(path), "train")) == 2


def test_missing_split_in_directory(tmp_path):
    with pytest.raises(DatasetError, match=r"no such file: .*test\.jsonl \(expected test\.jsonl, \.json, \.parquet or \.csv in"):
        load_gsm8k(str(tmp_path), "test")


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match="no such file"):
        load_gsm8k(str(tmp_path / "nope.jsonl"), "train")
    with pytest.raises(DatasetError, match="no such file"):
        load_gsm8k("./no/such/dir", "train")


def test_malformed_json_names_file_and_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [ROWS[0], ROWS[1], '{"question": "x", "answer": '])
    with pytest.raises(DatasetError, match=r"bad\.jsonl, line 3: malformed JSON"):
        load_gsm8k(str(path), "train")


def test_row_without_question_lists_keys(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [ROWS[0], {"prompt": "x", "answer": "#### 1"}])
    with pytest.raises(DatasetError, match=r"q\.jsonl, line 2: row has no 'question' key \(it has: prompt, answer\)"):
        load_gsm8k(str(path), "train")


def test_answer_without_marker(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"question": "x", "answer": "just 5"}])
    with pytest.raises(DatasetError, match=r"a\.jsonl, line 1: .*no '####'"):
        load_gsm8k(str(path), "train")
    path = write_jsonl(tmp_path / "b.jsonl", [{"question": "x", "answer": "5 ####  "}])
    with pytest.raises(DatasetError, match="nothing after"):
        load_gsm8k(str(path), "train")


def test_non_object_row_and_non_string_field(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", ["[1, 2]"])
    with pytest.raises(DatasetError, match="line 1: expected a JSON object"):
        load_gsm8k(str(path), "train")
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": 3, "answer": "#### 3"}])
    with pytest.raises(DatasetError, match="'question' must be a non-empty string"):
        load_gsm8k(str(path), "train")


def test_empty_dataset(tmp_path):
    (tmp_path / "train.jsonl").write_text("\n\n")
    with pytest.raises(DatasetError, match="empty"):
        load_gsm8k(str(tmp_path), "train")


def test_bad_limit(tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", ROWS)
    with pytest.raises(ValueError, match="limit"):
        load_gsm8k(str(path), "train", limit=0)


def test_hub_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(ValueError, match=r"needs the datasets package: pip install 'tandemrl\[data\]'.*local path"):
        load_gsm8k("openai/gsm8k", "train")


def test_hub_through_datasets(monkeypatch):
    calls = []

    def load_dataset(name, config, split):
        calls.append((name, config, split))
        return [{"question": "q1", "answer": "#### 7"}, {"question": "q2", "answer": "#### 8"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    samples = load_gsm8k("openai/gsm8k", "test", limit=1)
    assert calls == [("openai/gsm8k", "main", "test")]
    assert [s.answer for s in samples] == ["7"]


def test_hub_row_errors_name_the_row(monkeypatch):
    fake = types.SimpleNamespace(load_dataset=lambda *a, **k: [{"question": "q", "answer": "#### 1"}, {"q": 1}])
    monkeypatch.setitem(sys.modules, "datasets", fake)
    with pytest.raises(DatasetError, match="split 'train', row 2: row has no 'question'"):
        load_gsm8k("openai/gsm8k", "train")


def test_parquet_without_readers(tmp_path, monkeypatch):
    (tmp_path / "train.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(DatasetError, match=r"train\.parquet: reading parquet needs pyarrow"):
        load_gsm8k(str(tmp_path), "train")


def test_parquet_roundtrip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "train-00000-of-00001.parquet")
    samples = load_gsm8k(str(tmp_path), "train")
    assert [s.answer for s in samples] == ["4", "1234", "-5"]
    pq.write_table(pa.Table.from_pylist([{"question": "x", "solution": "#### 1"}]), tmp_path / "bad.parquet")
    with pytest.raises(DatasetError, match=r"bad\.parquet, row 1: row has no 'answer' key \(it has: question, solution\)"):
        load_gsm8k(str(tmp_path / "bad.parquet"), "train")


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared GSM8K copy not present")
def test_real_local_gsm8k():
    train = load_gsm8k(str(SHARED), "train")
    test = load_gsm8k(str(SHARED), "test")
    assert (len(train), len(test)) == (7473, 1319)
    assert train[0].answer == "72" and train[0].prompt.startswith("Natalia sold clips")
    assert all(s.answer.lstrip("-").replace(".", "", 1).isdigit() for s in train + test)
