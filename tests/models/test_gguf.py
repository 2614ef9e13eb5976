"""GGUF as a model source: a tiny Llama written as llama.cpp lays one out (q/k permuted, MLP in Q4_1, a wrong eos)
loads into a plain trainable model with the file's weights, saves as a Hugging Face directory, gets its
end-of-turn token fixed, and the engine's Llama fast path decodes it token-for-token like HF generate."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
from transformers import AutoModelForCausalLM  # noqa: E402

from tandemrl.models.load import ModelLoadError, load_model, load_tokenizer  # noqa: E402
from tests.tests_support.tiny_gguf import Q4_1_TENSORS, q4_1_roundtrip, tiny_llama, write_tiny_gguf  # noqa: E402


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory, reference) -> Path:
    return write_tiny_gguf(reference, tmp_path_factory.mktemp("gguf") / "tiny.Q4_1.gguf")


def expected_weights(reference) -> dict[str, torch.Tensor]:
    """The reference's weights as a GGUF reader must recover them: exact, except the Q4_1 tensors' rounding."""
    out = {}
    for name, tensor in reference.state_dict().items():
        quantised = any(part in name for part in Q4_1_TENSORS)
        out[name] = torch.from_numpy(q4_1_roundtrip(tensor.numpy())) if quantised else tensor
    return out


def test_loads_the_files_weights_into_a_plain_trainable_model(gguf_file, reference):
    model = load_model(str(gguf_file), device="cpu")
    assert type(model).__name__ == "LlamaForCausalLM"
    assert getattr(model, "hf_quantizer", None) is None and not getattr(model, "is_quantized", False)
    assert not hasattr(model.config, "quantization_config")
    loaded = model.state_dict()
    for name, want in expected_weights(reference).items():
        torch.testing.assert_close(loaded[name], want, rtol=0, atol=0, msg=name)  # q/k un-permuted exactly
    model.train()
    model(torch.tensor([[4, 5, 6]]), labels=torch.tensor([[4, 5, 6]]), use_cache=False).loss.backward()
    assert model.model.layers[0].mlp.up_proj.weight.grad is not None


def test_dtype_and_save_pretrained_round_trip(gguf_file, tmp_path):
    model = load_model(str(gguf_file), device="cpu", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    model.save_pretrained(tmp_path / "saved")
    assert "quantization_config" not in (tmp_path / "saved" / "config.json").read_text()
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.bfloat16)
    for name, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def test_tokenizer_eos_becomes_the_end_of_turn_token_and_the_fix_is_logged(gguf_file, caplog):
    with caplog.at_level(logging.WARNING, logger="tandemrl.models.gguf"):
        tokenizer = load_tokenizer(str(gguf_file))
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)  # the file says <|endoftext|> (0)
    assert tokenizer.pad_token_id == 2 and tokenizer.padding_side == "left"
    assert any("'<|endoftext|>' (id 0) -> '<|im_end|>' (id 2)" in r.getMessage() for r in caplog.records)
    text = "12+3= a b\n"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "1+1"}], tokenize=False,
                                         add_generation_prompt=True)
    assert chat == "<|im_start|>user\n1+1<|im_end|>\n<|im_start|>assistant\n"


def test_the_engine_fast_path_decodes_it_like_hf_generate(gguf_file):
    from tandemrl.backends.engine_backend import EngineBackend
    from tandemrl.engine.config import EngineConfig
    from tandemrl.engine.model.forward import inspect_decoder
    from tandemrl.types import Request, SamplingParams

    model = load_model(str(gguf_file), device="cpu")
    tokenizer = load_tokenizer(str(gguf_file))
    assert inspect_decoder(model).model_type == "llama"  # the fast path, not the generic fallback
    prompts = [tokenizer(t).input_ids for t in ("12+34=", "What is 7*8?", "a")]
    backend = EngineBackend(model, tokenizer, EngineConfig(block_size=4, num_blocks=64, cuda_graphs=False))
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    rollouts = backend.generate([Request(f"r{i}", p, params) for i, p in enumerate(prompts)])
    for prompt, rollout in zip(prompts, rollouts):
        ids = torch.tensor([prompt])
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
                            pad_token_id=0, eos_token_id=None)
        assert rollout.completion_ids == hf[0, len(prompt):].tolist()


def test_clear_errors_for_a_missing_file_or_a_missing_gguf_package(gguf_file, tmp_path, monkeypatch):
    with pytest.raises(ModelLoadError, match="no such GGUF file"):
        load_model(str(tmp_path / "absent.gguf"), device="cpu")
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf now raises ImportError
    with pytest.raises(ModelLoadError, match=r"tandemrl\[gguf\]"):
        load_tokenizer(str(gguf_file))


def test_the_example_config_trains_from_a_gguf_and_checkpoints_a_plain_model(gguf_file, tmp_path):
    from transformers import AutoTokenizer

    from tandemrl.config import load_config
    from tandemrl.train.checkpoint import find_latest
    from tandemrl.train.loop import train

    example = Path(__file__).resolve().parents[2] / "examples" / "smollm2-arith.toml"
    cfg = load_config(example, [
        f'model.name_or_path="{gguf_file}"', "model.device=cpu", "rollout.prompts_per_step=2", "rollout.group_size=2",
        "rollout.max_tokens=4", "train.max_steps=2", "eval.limit=4", "eval.every_steps=0", "log.tensorboard=false",
    ])
    assert (cfg.data.task, cfg.eval.limit, cfg.data.use_chat_template) == ("arith2", 4, True)
    assert train(cfg, tmp_path / "run")["steps"] == 2
    saved = find_latest(tmp_path / "run" / "checkpoints")
    assert type(AutoModelForCausalLM.from_pretrained(saved)).__name__ == "LlamaForCausalLM"
    assert AutoTokenizer.from_pretrained(saved).eos_token == "<|im_end|>"  # the fix travels with the checkpoint


def test_end_of_turn_fix_is_idempotent_and_leaves_templateless_tokenizers_alone():
    from tandemrl.models.gguf import end_of_turn_token, fix_end_of_turn
    from tandemrl.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()  # eos <|endoftext|>, ChatML template
    assert end_of_turn_token(tokenizer) == "<|im_end|>"
    assert len(fix_end_of_turn(tokenizer)) == 1 and tokenizer.eos_token_id == 2
    assert fix_end_of_turn(tokenizer) == []
    plain = build_char_tokenizer()
    plain.chat_template = None
    assert end_of_turn_token(plain) is None and fix_end_of_turn(plain) == [] and plain.eos_token_id == 0
