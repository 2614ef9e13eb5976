"""The peer of bench/realistic_step.py: TRL's GRPOTrainer with vLLM colocated on the same GPU (issue 38 point 4).

Same shapes and lengths: a random-weight Qwen2.5 of bench.grpo_step's ARCHITECTURES (saved to a local folder with a
word-level tokenizer, as TRL and vLLM load from a path), 32 prompts of 128 tokens x 8 completions per step, each
completion stopping at a length drawn as realistic_step draws it (lognormal, median 600, sigma 1, cap 4096, the same
seeds: 1000 for the warm-up step, then 0, 1, ...). TRL builds one SamplingParams for all requests, so the drawn lengths
reach vLLM by wrapping the colocated `LLM.generate` TRL calls: each request gets a clone of TRL's SamplingParams with
its own max_tokens (and ignore_eos, which TRL passes through generation_kwargs). vLLM then does exactly the work of
rows that end at those lengths; TRL pads the batch and trains on it as it would real answers.

Everything else is TRL's default (GRPOConfig of TRL 1.16): loss "dapo", beta 0 (no reference model), vLLM importance
sampling correction on (one no-grad forward of the batch for old log-probs), vllm_gpu_memory_utilization 0.3, no sleep
mode, TRL's max_num_batched_tokens 4096 for vLLM. One optimizer step = 256 completions: per_device_train_batch_size
--micro-batch rows, gradient_accumulation_steps 256 / micro-batch, one generation per step.

Timed per optimizer step (a TrainerCallback, CUDA synchronised): step s; rollout s (the wrapped LLM.generate);
weight push s (TRL's sync_weights); update s = the rest (old log-probs, rewards, loss, backward, optimizer). Peak
memory: torch's max allocated (vLLM's KV cache and weights are torch tensors of this process) and the device's used
memory (cudaMemGetInfo, polled every 20 ms). Prints one JSON line; writes it to --out.

GPU: PYTHONPATH=/tmp/tvsite:$PWD python3 -m bench.peers.trl_vllm.trl_grpo_step --model qwen2.5-0.5b
CPU smoke (no vLLM, transformers generate, tiny shapes): python -m bench.peers.trl_vllm.trl_grpo_step --tiny --no-vllm
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import threading
import time
from datetime import date
from importlib import metadata
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, TrainerCallback

from bench.grpo_step import build_model
from bench.realistic_step import draw_lengths

WARMUP_SEED = 1000  # realistic_step's warm-up step; its timed steps use seeds 0, 1, ...


def save_model_and_tokenizer(args: argparse.Namespace, folder: Path) -> None:
    """The random-weight model (bf16 on GPU) and a word-level tokenizer with one word per vocabulary id."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = build_model(args.model, torch.device("cpu"), args.dtype, gradient_checkpointing=False)
    model.save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    eos = f"t{model.config.vocab_size - 1}"
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token=eos, pad_token=eos).save_pretrained(folder)


def prompts_dataset(args: argparse.Namespace, vocab_size: int):
    from datasets import Dataset

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab_size - 1, (args.prompts, args.prompt_len), generator=gen).tolist()
    return Dataset.from_dict({"prompt": [" ".join(f"t{i}" for i in row) for row in ids]})


def random_reward(completions, **_) -> list[float]:
    return [random.random() for _ in completions]  # speed does not depend on the reward's values


class StepClock(TrainerCallback):
    """Per optimizer step: wall time, the rollout and weight-push time inside it, and the memory peaks."""

    def __init__(self, device: torch.device):
        self.device, self.steps, self.rollout_s, self.sync_s = device, [], 0.0, 0.0
        self.rollout_tokens = self.drawn_tokens = 0
        self.device_peak, self._watching = 0, False

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _watch(self) -> None:  # the device's used memory, vLLM's pools included whatever allocator holds them
        while self._watching:
            free, total = torch.cuda.mem_get_info(self.device)
            self.device_peak = max(self.device_peak, total - free)
            time.sleep(0.02)

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self.rollout_s = self.sync_s = 0.0
        self.rollout_tokens = self.drawn_tokens = 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.device_peak, self._watching = 0, True
            threading.Thread(target=self._watch, daemon=True).start()
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._sync()
        step_s = time.perf_counter() - self.start
        self._watching = False
        cuda = self.device.type == "cuda"
        self.steps.append({
            "step_s": step_s, "rollout_s": self.rollout_s, "weight_push_s": self.sync_s,
            "update_s": step_s - self.rollout_s - self.sync_s,
            "peak_gib": torch.cuda.max_memory_allocated(self.device) / 2**30 if cuda else float("nan"),
            "peak_reserved_gib": torch.cuda.max_memory_reserved(self.device) / 2**30 if cuda else float("nan"),
            "peak_device_used_gib": self.device_peak / 2**30 if cuda else float("nan"),
            "completion_tokens": self.rollout_tokens, "drawn_tokens": self.drawn_tokens,
        })

    def timed(self, fn, field: str):
        def wrapper(*a, **kw):
            self._sync()
            start = time.perf_counter()
            out = fn(*a, **kw)
            self._sync()
            setattr(self, field, getattr(self, field) + time.perf_counter() - start)
            return out
        return wrapper


def lengths_per_request(generate, args: argparse.Namespace, clock: StepClock):
    """Wraps vLLM's LLM.generate as TRL calls it (one SamplingParams): each request gets its drawn max_tokens."""
    seeds = iter([WARMUP_SEED, *range(args.repeats)])

    def generate_with_lengths(prompts, sampling_params=None, **kwargs):
        lengths = draw_lengths(len(prompts), args, next(seeds))
        per_request = []
        for length in lengths:
            params = sampling_params.clone()
            params.max_tokens = length
            per_request.append(params)
        outputs = generate(prompts, sampling_params=per_request, **kwargs)
        clock.rollout_tokens += sum(len(c.token_ids) for o in outputs for c in o.outputs)
        clock.drawn_tokens += sum(lengths)
        return outputs
    return generate_with_lengths


def build_trainer(args: argparse.Namespace, folder: Path, device: torch.device, clock: StepClock):
    from trl import GRPOConfig, GRPOTrainer

    rows = args.prompts * args.group
    config = GRPOConfig(
        output_dir=str(folder / "trainer"), report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        max_steps=1 + args.repeats, seed=0, learning_rate=1e-6, use_cpu=device.type != "cuda",
        bf16=device.type == "cuda", model_init_kwargs={"dtype": args.dtype},
        gradient_checkpointing=args.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if args.gradient_checkpointing else None,
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=rows // args.micro_batch,
        num_generations=args.group, max_completion_length=args.cap, temperature=1.0,
        use_vllm=not args.no_vllm, vllm_mode="colocate", vllm_gpu_memory_utilization=args.gpu_memory_utilization,
        vllm_enable_sleep_mode=args.sleep_mode, vllm_max_model_length=args.prompt_len + args.cap,
        generation_kwargs={"ignore_eos": True} if not args.no_vllm else None,
    )
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder, padding_side="left")
    trainer = GRPOTrainer(model=str(folder), reward_funcs=random_reward, args=config, processing_class=tokenizer,
                          train_dataset=prompts_dataset(args, tokenizer.vocab_size), callbacks=[clock])
    if args.no_vllm:  # the smoke: transformers generate, each row to the cap (no per-request lengths there)
        trainer.model.generate = clock.timed(trainer.model.generate, "rollout_s")
    else:
        vllm_generation = trainer.vllm_generation
        llm = vllm_generation.llm
        llm.generate = clock.timed(lengths_per_request(llm.generate, args, clock), "rollout_s")
        vllm_generation.sync_weights = clock.timed(vllm_generation.sync_weights, "sync_s")
    return trainer


def versions() -> dict:
    found = {}
    for name in ["torch", "transformers", "trl", "vllm", "accelerate", "datasets"]:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def parse_args() -> argparse.Namespace:
    from bench.grpo_step import ARCHITECTURES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(ARCHITECTURES))
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: the tiny architecture, small shapes")
    parser.add_argument("--no-vllm", action="store_true", help="transformers generate instead of vLLM (CPU smoke)")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--median", type=float, default=600.0, help="median completion length")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the completion lengths")
    parser.add_argument("--cap", type=int, default=4096, help="longest completion (max_completion_length)")
    parser.add_argument("--micro-batch", type=int, default=4, help="per_device_train_batch_size (rows per forward)")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="as realistic_step's flag (TRL: on)")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="vLLM's share (TRL's default)")
    parser.add_argument("--sleep-mode", action="store_true", help="vllm_enable_sleep_mode (TRL's default: off)")
    parser.add_argument("--repeats", type=int, default=1, help="timed steps after one warm-up step")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/trl_grpo_step"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.tiny:
        args.model, args.prompts, args.group, args.prompt_len, args.median, args.cap = "tiny", 2, 4, 8, 12.0, 48
    if (args.prompts * args.group) % args.micro_batch:
        parser.error(f"--micro-batch {args.micro_batch} must divide prompts x group = {args.prompts * args.group}")
    args.out = args.out or Path(f"bench/out/trl_vllm_step_{args.model}.json")
    return args


def main() -> None:
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    folder = args.workdir / args.model
    save_model_and_tokenizer(args, folder)
    clock = StepClock(device)
    trainer = build_trainer(args, folder, device, clock)
    trainer.train()
    timed = clock.steps[1:]  # the first step is the warm-up (vLLM's graphs and caches, the optimizer's state)
    median = sorted(timed, key=lambda s: s["step_s"])[len(timed) // 2]
    result = {
        "peer": "trl-grpo-vllm-colocate" if not args.no_vllm else "trl-grpo-transformers-generate",
        "date": date.today().isoformat(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "versions": versions(), "model": args.model,
        "attn_implementation": trainer.model.config._attn_implementation,
        "shape": {"prompts": args.prompts, "group": args.group, "prompt_len": args.prompt_len, "median": args.median,
                  "sigma": args.sigma, "cap": args.cap},
        "settings": {"micro_batch": args.micro_batch, "gradient_checkpointing": args.gradient_checkpointing,
                     "vllm_gpu_memory_utilization": args.gpu_memory_utilization, "vllm_sleep_mode": args.sleep_mode,
                     "loss_type": trainer.args.loss_type, "beta": trainer.args.beta,
                     "vllm_importance_sampling_correction": trainer.args.vllm_importance_sampling_correction},
        "warmup": clock.steps[0], "runs": timed, "median": median,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
