"""load_model / load_tokenizer and LoRA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DistilBertConfig, T5Config

from tandemrl.models.load import ModelLoadError, load_model, load_tokenizer, resolve_dtype, resolve_name_or_path
from tandemrl.models.lora import LoraSettings, apply_lora, unwrap_causal_lm
from tandemrl.models.tiny import make_tiny_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_load_model_and_tokenizer(tiny_dir):
    model = load_model(str(tiny_dir), device="cpu")
    assert model.dtype == torch.float32  # "auto" on CPU
    assert model.device.type == "cpu"
    assert not model.training
    assert load_model(str(tiny_dir), device="cpu", dtype="bfloat16").dtype == torch.bfloat16
    tok = load_tokenizer(str(tiny_dir))
    assert tok.padding_side == "left" and tok.pad_token_id == tok.eos_token_id == 0
    assert tok("é")["input_ids"] == [3, 3]  # <unk> even where transformers' Qwen2Tokenizer drops it
    assert tok.decode(tok("3+4=7\nHello, World!")["input_ids"]) == "3+4=7\nHello, World!"


def test_gradient_checkpointing_keeps_the_cache_setting(tiny_dir):
    model = load_model(str(tiny_dir), device="cpu", gradient_checkpointing=True)
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    assert model.config.use_cache  # the rollout needs it; training forwards pass use_cache=False
    model.train()
    ids = torch.tensor([[4, 5, 6, 7]])
    model(ids, use_cache=False).logits.sum().backward()
    assert model.model.embed_tokens.weight.grad is not None


def test_missing_config_json(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelLoadError, match="has no config.json: not a Hugging Face model directory"):
        load_model(str(tmp_path), device="cpu")


@pytest.mark.parametrize("name", ["./no-such-model", "/no/such/model", "~/no-such-model-dir", "a/b/c"])
def test_nonexistent_path(name):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(name, device="cpu")
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_tokenizer(name)


def test_file_is_not_a_model_dir(tmp_path):
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="is a file"):
        load_model(str(f), device="cpu")


def test_hub_id_that_cannot_be_fetched(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # fail fast, no network
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="could not load 'no-such-org/no-such-model' from the Hugging Face hub"):
        load_model("no-such-org/no-such-model", device="cpu")


@pytest.mark.parametrize("config_cls", [T5Config, DistilBertConfig])
def test_non_decoder_only_model_is_refused(tmp_path, config_cls):
    config_cls().save_pretrained(tmp_path)  # no weights needed: refused from config.json alone
    with pytest.raises(ModelLoadError, match="AutoModelForCausalLM cannot load"):
        load_model(str(tmp_path), device="cpu")


def test_bad_dtype_and_device(tiny_dir):
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        resolve_dtype("float8", torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match="CUDA is not available"):
            load_model(str(tiny_dir), device="cuda")


def test_resolve_tiny_name(tmp_path):
    path = resolve_name_or_path("tiny", tiny_dir=tmp_path / "tiny", tiny_seed=0)
    assert (Path(path) / "config.json").is_file()
    assert resolve_name_or_path("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"


def test_lora_trains_only_adapters_and_starts_at_the_base_output(tiny_dir):
    model = load_model(str(tiny_dir), device="cpu")
    ids = torch.tensor([[7, 76, 8, 84, 11], [4, 5, 6, 7, 8]])
    with torch.no_grad():
        base = model(ids).logits.clone()
    wrapped = apply_lora(model, LoraSettings(rank=4, alpha=8))
    trainable = [n for n, p in wrapped.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert len(trainable) == 2 * 7 * 2  # A and B, 7 projections, 2 layers
    with torch.no_grad():
        assert torch.equal(wrapped(ids).logits, base)  # LoRA B starts at zero

    causal = unwrap_causal_lm(wrapped)
    assert type(causal).__name__ == "Qwen2ForCausalLM"
    assert unwrap_causal_lm(causal) is causal
    hidden = causal.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
    assert torch.allclose(causal.get_output_embeddings()(hidden), base, atol=1e-6)

    # One step moves the output: the LoRA layers sit inside the decoder unwrap_causal_lm returns.
    wrapped.train()
    opt = torch.optim.SGD([p for p in wrapped.parameters() if p.requires_grad], lr=1.0)
    wrapped(ids, use_cache=False).logits.logsumexp(-1).sum().backward()
    opt.step()
    with torch.no_grad():
        assert not torch.equal(causal(ids).logits, base)


def test_lora_unknown_target_module(tiny_dir):
    model = load_model(str(tiny_dir), device="cpu")
    with pytest.raises(ValueError, match="not modules of this model"):
        apply_lora(model, LoraSettings(target_modules=["q_proj", "query_key_value"]))


def test_unwrap_rejects_non_causal_lm():
    with pytest.raises(TypeError):
        unwrap_causal_lm(torch.nn.Linear(2, 2))
