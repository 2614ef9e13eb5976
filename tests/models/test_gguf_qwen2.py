"""GGUF loading covers Qwen2 as Qwen2.5-Coder-0.5B-Instruct's Q4_K_M file lays it out (tests/models/tiny_qwen2_gguf.py):
the four quant types dequantised exactly, q/k/v biases, the separate output head kept untied, a trainable bf16 model,
the ChatML tokenizer ending turns on <|im_end|>; the engine's Qwen2 fast path decodes it like HF generate, and
bench/greedy_parity.py's recipe mode runs on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")
from tandemrl.models.load import load_model, load_tokenizer  # noqa: E402
from tests.models.tiny_qwen2_gguf import write_tiny_qwen2_gguf  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("qwen2") / "tiny-qwen2.Q4_K_M.gguf"
    return path, write_tiny_qwen2_gguf(path)


def test_every_quant_type_dequantises_exactly_into_an_untied_qwen2(tiny):
    path, expected = tiny
    model = load_model(str(path), device="cpu")
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert not model.config.tie_word_embeddings and not hasattr(model.config, "quantization_config")
    state = model.state_dict()
    assert set(state) == set(expected)
    for name, want in expected.items():
        torch.testing.assert_close(state[name], torch.from_numpy(want), rtol=0, atol=0, msg=name)
    assert not torch.equal(state["lm_head.weight"], state["model.embed_tokens.weight"])  # Q8_0 head, Q5_0 embedding


def test_bf16_model_trains(tiny):
    model = load_model(str(tiny[0]), device="cpu", dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()  # untied
    model.train()
    ids = torch.tensor([[3, 4, 5, 6]])
    model(ids, labels=ids, use_cache=False).loss.backward()
    assert model.model.layers[1].mlp.down_proj.weight.grad is not None  # the Q4_K tensor is a plain parameter


def test_chatml_tokenizer_ends_turns_on_im_end(tiny):
    tokenizer = load_tokenizer(str(tiny[0]))
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.padding_side) == ("<|im_end|>", 2, "left")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "1+1"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\n1+1<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(tokenizer(text).input_ids) == text


def test_the_files_control_and_user_defined_tokens_are_read_from_its_header(tiny):
    from tandemrl.models.gguf import file_tokens
    from tests.models.tiny_qwen2_gguf import TOKENS

    tool = TOKENS.index("<tool_call>")
    assert file_tokens(str(tiny[0])) == [(0, "<|endoftext|>", True), (1, "<|im_start|>", True),
                                         (2, "<|im_end|>", True), (tool, "<tool_call>", False)]
    assert load_tokenizer(str(tiny[0]))("a<tool_call>").input_ids == [3, tool]


def test_tokens_the_converter_left_out_become_single_tokens_without_growing_the_vocabulary():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from tandemrl.models.gguf import register_file_tokens

    vocab = {c: i for i, c in enumerate("<>_abcelot/")} | {"<tool_call>": 11, "</tool_call>": 12, "<|x|>": 13}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab, [])))
    assert len(tokenizer("<tool_call>").input_ids) == 11  # split, as transformers 5.17 leaves Qwen2's
    tokens = [(11, "<tool_call>", False), (12, "</tool_call>", False), (13, "<|x|>", True), (5, "<|absent|>", True)]
    assert register_file_tokens(tokenizer, tokens) == ["<tool_call>", "</tool_call>", "<|x|>"]
    assert tokenizer("a<tool_call>b</tool_call><|x|>").input_ids == [3, 11, 4, 12, 13]
    assert len(tokenizer) == 14
    kept = tokenizer.decode([3, 11, 13], skip_special_tokens=True).replace(" ", "")  # no decoder: spaces between
    assert kept == "a<tool_call>"  # the control token is skipped, the user-defined one kept
    assert register_file_tokens(tokenizer, tokens) == []


def test_the_engine_qwen2_fast_path_decodes_it_like_hf_generate(tiny):
    from tandemrl.backends.engine_backend import EngineBackend
    from tandemrl.engine.config import EngineConfig
    from tandemrl.engine.model.forward import inspect_decoder
    from tandemrl.types import Request, SamplingParams

    model = load_model(str(tiny[0]), device="cpu")
    assert inspect_decoder(model).model_type == "qwen2"
    prompts = [[3, 4, 5], [30, 31, 42, 7, 8, 9, 10], [12]]
    backend = EngineBackend(model, None, EngineConfig(block_size=4, num_blocks=64, cuda_graphs=False))
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    rollouts = backend.generate([Request(f"r{i}", p, params) for i, p in enumerate(prompts)])
    for prompt, rollout in zip(prompts, rollouts):
        ids = torch.tensor([prompt])
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=10,
                            min_new_tokens=10, pad_token_id=0, eos_token_id=None)
        assert rollout.completion_ids == hf[0, len(prompt):].tolist()


def test_greedy_parity_recipe_mode_runs_on_gsm8k_rows(tiny, tmp_path):
    from bench.greedy_parity import main

    data = tmp_path / "gsm8k"
    data.mkdir()
    rows = [{"question": "what is 12+3?", "answer": "12+3=15\n#### 15"},
            {"question": "what is 2*4?", "answer": "2*4=8\n#### 8"}]
    for split in ("train", "test"):
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = Path(__file__).resolve().parents[2] / "examples" / "qwen-coder-0.5b-gsm8k.toml"
    config = tmp_path / "recipe.toml"
    config.write_text(recipe.read_text().replace("runs/models/Qwen2.5-Coder-0.5B-Instruct-AWQ.Q4_K_M.gguf",
                                                 str(tiny[0])))
    out = tmp_path / "parity.json"
    status = main(["--config", str(config), "--data", str(data), "--prompts", "2", "--new-tokens", "6",
                   "--json", str(out)])
    result = json.loads(out.read_text())
    assert status == 0 and result["identical"] == 2 and result["prompts"] == 2
