"""Qwen2.5-Coder-0.5B-Instruct from its GGUF file (issue 39) answers a GSM8K question, rendered as its recipe renders
it (chat template, the recipe's system prompt), on the CPU. The file is not in the repository (bench/qwen_coder_gguf.sh fetch puts it under runs/models): without it
this test is skipped, saying so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
FILE = ROOT / "runs" / "models" / "Qwen2.5-Coder-0.5B-Instruct-AWQ.Q4_K_M.gguf"
RECIPE = ROOT / "examples" / "qwen-coder-0.5b-gsm8k.toml"
QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May?")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not FILE.is_file(), reason=f"{FILE.name} is not here: bench/qwen_coder_gguf.sh fetch"),
]


def test_the_instruct_model_answers_a_gsm8k_question_through_chatml():
    pytest.importorskip("gguf")
    from tandemrl.config import load_config
    from tandemrl.data.gsm8k import gsm8k_prompt
    from tandemrl.data.tasks import format_prompt
    from tandemrl.models.gguf import align_generation_eos
    from tandemrl.models.load import load_model, load_tokenizer
    from tandemrl.types import Sample

    tokenizer = load_tokenizer(str(FILE))
    assert (tokenizer.eos_token, tokenizer.eos_token_id, len(tokenizer)) == ("<|im_end|>", 151645, 151936)
    assert tokenizer("<tool_call>12").input_ids == [151657, 16, 17]  # Qwen's added token whole, digits one by one
    model = load_model(str(FILE), device="cpu", dtype="float32")
    assert type(model).__name__ == "Qwen2ForCausalLM" and not model.config.tie_word_embeddings
    align_generation_eos(model, tokenizer)
    cfg = load_config(RECIPE)
    assert cfg.model.name_or_path == str(FILE.relative_to(ROOT)) and cfg.data.use_chat_template
    sample = Sample(prompt=gsm8k_prompt(QUESTION), answer="72")
    text = format_prompt(sample, tokenizer, True, cfg.data.system_prompt)
    assert text.startswith(f"<|im_start|>system\n{cfg.data.system_prompt}<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("<|im_start|>assistant\n")
    ids = tokenizer(text, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**ids, do_sample=False, max_new_tokens=64)
    answer = tokenizer.decode(out[0, ids.input_ids.shape[1]:], skip_special_tokens=True)
    print(answer)
    words = re.findall(r"[a-z]+", answer.lower())
    assert {"clips", "april", "may"} <= set(words), answer  # on topic, in English (64 tokens: not yet the sum)
