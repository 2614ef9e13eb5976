"""bench/peers/trl_vllm/trl_grpo_step.py without TRL or vLLM: the drawn lengths reach vLLM one request at a time, the
same draws as bench/realistic_step.py, and the saved tokenizer maps one word to one id (prompts keep their length)."""

import argparse
import copy
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from transformers import PreTrainedTokenizerFast

from bench.peers.trl_vllm.trl_grpo_step import WARMUP_SEED, StepClock, lengths_per_request, save_model_and_tokenizer
from bench.realistic_step import draw_lengths


@dataclass
class FakeSamplingParams:  # vLLM's SamplingParams as TRL builds it: one for all requests
    max_tokens: int
    ignore_eos: bool = True

    def clone(self):
        return copy.copy(self)


def test_each_request_gets_its_drawn_length_step_after_step():
    args = argparse.Namespace(median=600.0, sigma=1.0, cap=4096, repeats=2)
    seen = []

    def generate(prompts, sampling_params=None, **kwargs):
        seen.append([p.max_tokens for p in sampling_params])
        assert kwargs == {"use_tqdm": False} and all(p.ignore_eos for p in sampling_params)
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[0] * p.max_tokens)]) for p in sampling_params]

    clock = StepClock(torch.device("cpu"))
    wrapped = lengths_per_request(generate, args, clock)
    shared = FakeSamplingParams(max_tokens=args.cap)
    for _ in range(3):
        wrapped([[1, 2]] * 256, sampling_params=shared, use_tqdm=False)
    assert seen == [draw_lengths(256, args, seed) for seed in (WARMUP_SEED, 0, 1)]
    assert shared.max_tokens == args.cap  # TRL's params untouched
    assert clock.rollout_tokens == clock.drawn_tokens == sum(map(sum, seen))
    assert max(max(s) for s in seen) <= args.cap and len(set(seen[1])) > 10


def test_saved_tokenizer_keeps_one_id_per_word(tmp_path):
    args = argparse.Namespace(model="tiny", dtype=torch.float32)
    save_model_and_tokenizer(args, tmp_path)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(tmp_path)
    ids = [5, 17, 300, 0, 510]
    assert tokenizer(" ".join(f"t{i}" for i in ids))["input_ids"] == ids
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == 511 and (tmp_path / "config.json").exists()
