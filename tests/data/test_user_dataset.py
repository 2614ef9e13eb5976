"""A user's own dataset: every format, both TRL prompt formats, the held-out split, and each bad input's message."""

import csv
import json
import sys
import types

import pytest

from tandemrl.config import DataConfig
from tandemrl.data.loading import check_batch_fits, load_data
from tandemrl.data.sources import DatasetError
from tandemrl.data.tasks import reward_columns

ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1), "level": i % 3} for i in range(20)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def load(path, **keys):
    return load_data(DataConfig(path=str(path), **keys), seed=0, eval_limit=None)


def write_format(tmp_path, ext):
    path = tmp_path / f"train{ext}"
    if ext == ".jsonl":
        write_jsonl(path, ROWS)
    elif ext == ".json":
        path.write_text(json.dumps(ROWS))
    elif ext == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(ROWS[0]))
            writer.writeheader()
            writer.writerows(ROWS)
    elif ext == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(ROWS), path)
    return path


@pytest.mark.parametrize("ext", [".jsonl", ".json", ".csv", ".parquet"])
def test_every_file_format_gives_the_same_prompts_and_columns(tmp_path, ext):
    data = load(write_format(tmp_path, ext))
    samples = data.train + data.test
    assert sorted(s.prompt for s in samples) == sorted(r["prompt"] for r in ROWS)
    by_prompt = {s.prompt: s for s in samples}
    for row in ROWS:
        columns = by_prompt[row["prompt"]].columns
        assert str(columns["answer"]) == row["answer"] and int(columns["level"]) == row["level"]
        assert "prompt" not in columns  # nothing added, nothing of the prompt duplicated


def test_held_out_split_is_seeded_disjoint_and_says_so(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    first, again = load(path, test_fraction=0.25), load(path, test_fraction=0.25)
    assert len(first.test) == 5 and len(first.train) == 15
    assert [s.prompt for s in first.test] == [s.prompt for s in again.test]
    assert not {s.prompt for s in first.test} & {s.prompt for s in first.train}
    assert "5 rows of" in first.test_origin and "held out" in first.test_origin and "test_fraction" in first.test_origin
    other = load(path, test_fraction=0.25, split_seed=1)
    assert [s.prompt for s in other.test] != [s.prompt for s in first.test]


def test_test_path_and_folder_splits(tmp_path):
    train, test = write_jsonl(tmp_path / "a.jsonl", ROWS[:12]), write_jsonl(tmp_path / "b.jsonl", ROWS[12:])
    data = load(train, test_path=str(test))
    assert len(data.train) == 12 and len(data.test) == 8 and "data.test_path" in data.test_origin
    folder = tmp_path / "folder"
    folder.mkdir()
    write_jsonl(folder / "train.jsonl", ROWS[:12])
    write_jsonl(folder / "test.jsonl", ROWS[12:])
    data = load(folder)
    assert len(data.train) == 12 and len(data.test) == 8 and "split 'test'" in data.test_origin


def test_folder_saved_by_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:14]),
                          "test": datasets.Dataset.from_list(ROWS[14:])}).save_to_disk(tmp_path / "saved")
    data = load(tmp_path / "saved")
    assert len(data.train) == 14 and len(data.test) == 6
    assert data.train[0].columns["level"] == ROWS[0]["level"]


def test_in_memory_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    data = load_data(DataConfig(), 0, None, train_source=ROWS[:10], test_source=datasets.Dataset.from_list(ROWS[10:]))
    assert len(data.train) == 10 and len(data.test) == 10


def test_chat_message_prompts(tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"{i}?"}],
             "solution": str(i)} for i in range(6)]
    data = load(write_jsonl(tmp_path / "chat.jsonl", rows))
    assert all(isinstance(s.prompt, list) and s.prompt[-1]["role"] == "user" for s in data.train + data.test)


def test_prompt_column_is_configurable(tmp_path):
    rows = [{"question": f"{i}?", "answer": str(i)} for i in range(5)]
    data = load(write_jsonl(tmp_path / "q.jsonl", rows), prompt_column="question")
    assert {s.prompt for s in data.train + data.test} == {r["question"] for r in rows}


def test_missing_column_names_it_and_lists_those_present(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "1?", "answer": "1"}] * 3)
    with pytest.raises(DatasetError, match=r"q\.jsonl, line 1: no 'prompt' column \(data\.prompt_column\); the "
                                           r"columns are: question, answer"):
        load(path)


def test_a_bad_row_names_its_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"prompt": 7}) + "\n")
    with pytest.raises(DatasetError, match=r"bad\.jsonl, line 2: 'prompt' must be a string or a list of chat"):
        load(path)
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"prompt": [{"role": "user"}]}) + "\n")
    with pytest.raises(DatasetError, match=r"bad\.jsonl, line 2: 'prompt' message 0 must be an object"):
        load(path)
    path.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(DatasetError, match=r"bad\.jsonl, line 2: malformed JSON"):
        load(path)


def test_non_utf8_byte_names_file_and_line(tmp_path):
    for name in ("bad.jsonl", "bad.csv"):
        path = tmp_path / name
        path.write_bytes(b'{"prompt": "ok"}\n' if name.endswith("jsonl") else b"prompt\nok\n")
        with path.open("ab") as f:
            f.write(b'{"prompt": "caf\xe9"}\n' if name.endswith("jsonl") else b"caf\xe9\n")
        with pytest.raises(DatasetError, match=rf"{name}, line \d: not valid UTF-8 \(byte 0xe9"):
            load(path)


def test_one_row_dataset_names_the_file_and_the_key(tmp_path):
    path = write_jsonl(tmp_path / "one.jsonl", ROWS[:1])
    with pytest.raises(DatasetError, match=r"one\.jsonl has 1 row: too few to hold out a test set; give "
                                           r"data\.test_path"):
        load(path)
    data = load(path, test_path=str(path))
    with pytest.raises(DatasetError, match=r"data\.path .*one\.jsonl has 1 training row\(s\), fewer than "
                                           r"rollout\.prompts_per_step = 16"):
        check_batch_fits(data.train, 16, f"data.path {path}")


def test_presets_refuse_a_data_path_and_gsm8k_is_a_preset_of_the_same_loader(tmp_path):
    with pytest.raises(DatasetError, match="generates its data: unset data.path"):
        load_data(DataConfig(task="synthetic:add", path="x.jsonl"), 0, None)
    gsm = write_jsonl(tmp_path / "gsm.jsonl", [{"question": f"q{i}", "answer": f"so #### {i}"} for i in range(10)])
    data = load_data(DataConfig(task="gsm8k", path=str(gsm)), 0, None)
    assert len(data.test) == 1 and "held out" in data.test_origin
    assert data.train[0].prompt.endswith('"#### <number>".') and data.train[0].answer.isdigit()


def test_held_out_keys_with_a_test_path_are_an_error():
    from tandemrl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="data.test_fraction has no effect with data.test_path set"):
        load_config(None, ['data.path="a.jsonl"', 'data.test_path="b.jsonl"', "data.test_fraction=0.2"])
    with pytest.raises(ConfigError, match="data.prompt_column applies to your own dataset"):
        load_config(None, ['data.task="gsm8k"', 'data.prompt_column="question"'])


def test_a_column_only_some_rows_have_reaches_the_rewards_on_every_batch(tmp_path):
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(10)]
    rows[5]["hint"] = "add one"  # only row 5 (line 6) has it, as in a hand-written .jsonl
    data = load(write_jsonl(tmp_path / "d.jsonl", rows), test_path=str(write_jsonl(tmp_path / "t.jsonl", rows)))

    def reward(completions, hint, **kwargs):  # a TRL reward that takes the column by name
        return [1.0 if h else 0.0 for h in hint]

    seen = []
    for start in range(0, len(data.train), 2):  # every batch, whichever rows it holds
        batch = data.train[start:start + 2]
        columns = reward_columns(batch)
        assert sorted(columns) == ["answer", "hint"]
        seen += reward(["x"] * len(batch), **columns)
    assert seen == [1.0 if i == 5 else 0.0 for i in range(10)]
    assert data.train[5].columns["hint"] == "add one" and data.train[0].columns == {"answer": "1", "hint": None}


@pytest.fixture
def no_hub(monkeypatch):
    """A `datasets` whose hub always fails, as offline; records the names asked for."""
    asked = []

    def load_dataset(name, subset, split):
        asked.append(name)
        raise ConnectionError(f"Couldn't reach {name!r} on the Hub")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    return asked


def test_a_missing_local_file_names_the_key_the_full_path_and_close_names(tmp_path, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(DatasetError) as err:
        load("train.jsonll")
    message = str(err.value)
    assert message.startswith("data.path = 'train.jsonll': no such file or directory: ")
    assert str(tmp_path / "train.jsonll") in message
    assert f"relative path starts from the working directory, {tmp_path}, not from the config file" in message
    assert "did you mean 'train.jsonl'?" in message
    (tmp_path / "data").mkdir()
    with pytest.raises(DatasetError, match=r"^data\.test_path = 'data/tset\.jsonl': no such file or directory: "):
        load("train.jsonl", test_path="data/tset.jsonl")
    with pytest.raises(DatasetError, match=r"^data\.path = 'data/trian': no such file or directory: "):
        load("data/trian")  # its folder exists here: not a hub id
    with pytest.raises(DatasetError, match=r"no such file or directory: /no/such/x\.csv; the folder /no/such does "
                                           r"not exist either"):
        load("/no/such/x.csv")
    assert no_hub == []  # none of them was looked up on the hub


def test_a_name_that_may_be_a_hub_id_says_no_local_file_has_it_either(tmp_path, monkeypatch, no_hub):
    monkeypatch.chdir(tmp_path)
    write_jsonl(tmp_path / "mydata.jsonl", ROWS)
    with pytest.raises(DatasetError) as err:
        load("mydata")
    message = str(err.value)
    assert no_hub == ["mydata"]
    assert message.startswith("data.path = 'mydata': could not load hub dataset 'mydata'")
    assert "Couldn't reach 'mydata' on the Hub" in message
    assert f"there is no local file or folder {tmp_path / 'mydata'}" in message
    assert "did you mean 'mydata.jsonl'?" in message


def test_a_folder_without_the_split_names_the_key(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(DatasetError, match=r"^data\.test_path = '.*': no such file: .*test\.jsonl"):
        load(tmp_path / "train.jsonl", test_path=str(tmp_path))
