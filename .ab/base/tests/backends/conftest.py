"""Fixtures for the backend tests: a tiny random Qwen2 model and a char-level tokenizer, built offline."""

from __future__ import annotations

import string

import pytest
import torch
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

VOCAB_SIZE = 128
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2
# 30 multi-character tokens, so a stop string can be completed in the middle of a token.
MULTI = ["th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te", "of",
         "ed", "is", "it", "al", "ar", "st", "to", "nt", "ng", "se", "ha", "as", "ou", "io", "le"]


def build_model(seed: int = 0, **overrides) -> Qwen2ForCausalLM:
    cfg = dict(vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=1, intermediate_size=128, max_position_embeddings=256)
    cfg.update(overrides)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(Qwen2Config(**cfg)).float().eval()
    model.generation_config.eos_token_id = None
    return model


def build_tokenizer() -> PreTrainedTokenizerFast:
    tokens = ["<pad>", "<eos>", "<unk>"] + list(string.printable[:95]) + MULTI
    assert len(tokens) == VOCAB_SIZE and len(set(tokens)) == VOCAB_SIZE
    vocab = {tok: i for i, tok in enumerate(tokens)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                   unk_token="<unk>")


@pytest.fixture
def model() -> Qwen2ForCausalLM:
    return build_model()


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


@pytest.fixture
def make_model():
    """The model factory, for tests that need several models or config overrides."""
    return build_model
