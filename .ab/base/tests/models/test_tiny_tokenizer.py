"""The offline tiny model and its character tokenizer."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from tandemrl.models.tiny import ensure_tiny_model, make_tiny_model
from tandemrl.models.tokenizer import CHARACTERS, VOCAB_SIZE, build_char_tokenizer

TEXT = "3+4=7\nHello, World!"
EXPECTED_FILES = {
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_tokenizer_round_trip_and_fixed_ids():
    tok = build_char_tokenizer()
    assert len(tok) == VOCAB_SIZE == 100
    ids = tok(TEXT)["input_ids"]
    assert len(ids) == len(TEXT)  # one token per character, nothing added
    assert tok.decode(ids) == TEXT
    assert tok.decode(tok(CHARACTERS)["input_ids"]) == CHARACTERS
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]) == [0, 1, 2, 3]
    assert tok.eos_token_id == tok.pad_token_id == 0
    assert tok("0")["input_ids"] == [4]
    assert tok("é")["input_ids"] == [3, 3]  # each byte of an unknown character is <unk>
    assert tok.padding_side == "left"


def test_same_seed_gives_byte_identical_files(tmp_path):
    state = torch.random.get_rng_state()
    a = make_tiny_model(tmp_path / "a", seed=0)
    b = make_tiny_model(tmp_path / "b", seed=0)
    assert torch.equal(state, torch.random.get_rng_state()), "make_tiny_model changed the global RNG"
    assert set(_digests(a)) == EXPECTED_FILES
    assert _digests(a) == _digests(b)
    c = make_tiny_model(tmp_path / "c", seed=1)
    assert _digests(c)["model.safetensors"] != _digests(a)["model.safetensors"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp dirs left


def test_refuses_to_overwrite_unless_asked(tmp_path):
    out = make_tiny_model(tmp_path / "m", seed=0)
    before = _digests(out)
    with pytest.raises(FileExistsError):
        make_tiny_model(out, seed=1)
    assert _digests(out) == before
    make_tiny_model(out, seed=1, overwrite=True)
    assert _digests(out)["model.safetensors"] != before["model.safetensors"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert make_tiny_model(empty) == empty.resolve()  # an empty directory is fine
    assert ensure_tiny_model(empty) == empty.resolve()  # already built: left alone
    assert (ensure_tiny_model(tmp_path / "fresh") / "config.json").is_file()


def test_auto_classes_load_the_directory(tiny_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.tie_word_embeddings
    assert cfg.hidden_size // cfg.num_attention_heads == 32 and cfg.num_key_value_heads == 1
    assert cfg.vocab_size == len(tok) == VOCAB_SIZE
    assert cfg.eos_token_id == cfg.pad_token_id == cfg.bos_token_id == tok.eos_token_id
    assert model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    # Whatever class transformers picks for a qwen2 directory, the ids and the round trip are the same.
    assert tok(TEXT)["input_ids"] == build_char_tokenizer()(TEXT)["input_ids"]
    assert tok.decode(tok(TEXT)["input_ids"]) == TEXT
    as_file = PreTrainedTokenizerFast(tokenizer_file=str(tiny_dir / "tokenizer.json"))
    assert as_file(TEXT)["input_ids"] == tok(TEXT)["input_ids"]

    messages = [{"role": "system", "content": "Add."}, {"role": "user", "content": "3+4="}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    out = model.generate(torch.tensor([ids]), max_new_tokens=5, do_sample=False)
    assert out.shape[1] <= len(ids) + 5
    assert int(out.max()) < VOCAB_SIZE
