import json
from pathlib import Path

import pytest

from tandemrl.data.tasks import TASK_NAMES, format_prompt, load_task, reward_columns
from tandemrl.types import Sample

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"


def test_synthetic_splits_and_defaults():
    train = load_task("synthetic:add", "train", seed=0)
    test = load_task("synthetic:add", "test", seed=0)
    assert len(train) == 2000 and len(test) == 500
    assert [s.prompt for s in train[:50]] != [s.prompt for s in test[:50]]
    assert len(load_task("synthetic:copy", "train", limit=7, seed=0)) == 7
    assert [s.prompt for s in load_task("synthetic:add2", "test", seed=1)] == [
        s.prompt for s in load_task("synthetic:add2", "test", seed=1)
    ]


def test_gsm8k_from_path(tmp_path):
    (tmp_path / "test.jsonl").write_text(json.dumps({"question": "q", "answer": "#### 3"}) + "\n")
    samples = load_task("gsm8k", "test", path=str(tmp_path), limit=None, seed=0)
    assert [s.answer for s in samples] == ["3"]


@pytest.mark.skipif(not SHARED.is_dir(), reason="shared GSM8K copy not present")
def test_gsm8k_shared_with_limit():
    assert len(load_task("gsm8k", "train", path=str(SHARED), limit=16, seed=0)) == 16


def test_gsm8k_without_path_uses_hub(monkeypatch):
    import sys
    import types

    seen = []
    fake = types.SimpleNamespace(load_dataset=lambda n, c, split: seen.append(n) or [{"question": "q", "answer": "#### 1"}])
    monkeypatch.setitem(sys.modules, "datasets", fake)
    load_task("gsm8k", "train", path=None, limit=None, seed=0)
    assert seen == ["openai/gsm8k"]


def test_errors():
    with pytest.raises(ValueError, match="valid tasks: gsm8k, synthetic:add, synthetic:copy, synthetic:add2"):
        load_task("math500", "train", path=None, limit=None, seed=0)
    with pytest.raises(ValueError, match="valid tasks"):
        load_task("synthetic:mul", "train", path=None, limit=None, seed=0)
    with pytest.raises(ValueError, match="splits train, test"):
        load_task("synthetic:add", "validation", path=None, limit=None, seed=0)
    with pytest.raises(ValueError, match="takes no data path"):
        load_task("synthetic:add", "train", path="x", limit=None, seed=0)
    assert "gsm8k" in TASK_NAMES


class FakeTokenizer:
    chat_template = "{{ fake }}"

    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        self.calls.append((messages, tokenize, add_generation_prompt))
        return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"


def test_format_prompt():
    sample = Sample(prompt="3+4=", answer="7")
    tok = FakeTokenizer()
    assert format_prompt(sample, tok, use_chat_template=False, system_prompt="ignored") == "3+4="
    assert tok.calls == []
    assert format_prompt(sample, tok, True, None) == "user:3+4=|assistant:"
    assert format_prompt(sample, tok, True, "Be brief.") == "system:Be brief.|user:3+4=|assistant:"
    assert tok.calls[-1][1:] == (False, True)


def test_format_prompt_real_tokenizer_template():
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models

    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, "[UNK]")))
    tok.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    out = format_prompt(Sample(prompt="hi", answer="1"), tok, True, "sys")
    assert out == "<system>sys\n<user>hi\n<assistant>"


def test_format_prompt_without_template():
    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="no chat template"):
        format_prompt(Sample(prompt="x", answer="1"), NoTemplate(), True, None)


def test_reward_columns():
    samples = [
        Sample("a", "1", 0, {"question": "qa", "solution": "#### 1"}),
        Sample("b", "2", 1, {"question": "qb", "extra": 5}),
    ]
    assert reward_columns(samples) == {
        "answer": ["1", "2"],
        "question": ["qa", "qb"],
        "solution": ["#### 1", None],
        "extra": [None, 5],
    }
