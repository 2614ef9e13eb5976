"""TRL's ``GRPOConfig`` names and tandemrl's keys for them, for the unknown-key error: a user coming from TRL writes
``learning_rate`` and is told ``train.lr``.

docs/coming-from-trl.md is the long form of this table (with defaults and notes); tests/config/test_trl_names.py
keeps the two in agreement.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrlName:
    """What a TRL ``GRPOConfig`` name is in tandemrl: its keys (none where tandemrl has no equivalent), and a note."""

    keys: tuple[str, ...]
    note: str = ""


TRL_NAMES: dict[str, TrlName] = {
    # batch and generation
    "num_generations": TrlName(("rollout.group_size",), "completions per prompt"),
    "generation_batch_size": TrlName(("rollout.prompts_per_step",), "tandemrl counts prompts: generation_batch_size "
                                     "/ num_generations"),
    "per_device_train_batch_size": TrlName(
        ("rollout.prompts_per_step", "train.max_tokens_per_micro_batch"),
        "prompts per step, or, as a memory knob, tokens per forward in the update"),
    "steps_per_generation": TrlName(("rollout.prompts_per_step", "train.mini_batches"),
                                    "train.mini_batches is the optimizer steps per rollout batch"),
    "gradient_accumulation_steps": TrlName(("train.mini_batches",), "each mini-batch accumulates over its "
                                           "micro-batches"),
    "num_iterations": TrlName(("train.epochs_per_batch",), "passes over each rollout batch"),
    "max_completion_length": TrlName(("rollout.max_tokens",)),
    "max_prompt_length": TrlName(("data.max_prompt_tokens",)),
    "temperature": TrlName(("rollout.temperature",)),
    "top_p": TrlName(("rollout.top_p",)),
    "top_k": TrlName(("rollout.top_k",)),
    "min_p": TrlName(()),
    "repetition_penalty": TrlName(()),
    "generation_kwargs": TrlName((), "rollout.stop and rollout.ignore_eos exist"),
    "chat_template_kwargs": TrlName(()),
    "num_generations_eval": TrlName(("eval.pass_k",), "samples per test prompt for pass@k"),
    "shuffle_dataset": TrlName((), "the data order is seeded by train.seed"),
    "remove_unused_columns": TrlName((), "every column always reaches the rewards"),
    # the loss
    "learning_rate": TrlName(("train.lr",)),
    "lr_scheduler_type": TrlName(("train.lr_schedule",)),
    "warmup_steps": TrlName(("train.warmup_steps",)),
    "warmup_ratio": TrlName((), "set train.warmup_steps"),
    "weight_decay": TrlName(("train.weight_decay",)),
    "adam_beta1": TrlName(("train.adam_betas",), "both betas in one list"),
    "adam_beta2": TrlName(("train.adam_betas",), "both betas in one list"),
    "max_grad_norm": TrlName(("train.max_grad_norm",)),
    "beta": TrlName(("train.kl_beta",)),
    "epsilon": TrlName(("train.eps_low",)),
    "epsilon_high": TrlName(("train.eps_high",)),
    "delta": TrlName(()),
    "loss_type": TrlName(("train.aggregation",), "dapo is token-mean, grpo is seq-mean-token-mean, dr_grpo is "
                         "seq-mean-token-sum-norm"),
    "scale_rewards": TrlName(("train.advantage",), "group is grpo, none is dr_grpo"),
    "reward_weights": TrlName(("reward.weights",), "a table by reward name, not a list"),
    "multi_objective_aggregation": TrlName((), "always sum_then_normalize"),
    "importance_sampling_level": TrlName((), "token level"),
    "vllm_importance_sampling_correction": TrlName(("train.tis_cap",), "0 is off"),
    "vllm_importance_sampling_cap": TrlName(("train.tis_cap",)),
    "mask_truncated_completions": TrlName(()),
    "top_entropy_quantile": TrlName(()),
    "off_policy_mask_threshold": TrlName(()),
    "sync_ref_model": TrlName(()),
    "disable_dropout": TrlName(()),
    "cast_lm_head_to_fp32": TrlName(()),
    # model, memory, precision
    "model_init_kwargs": TrlName(("model.dtype", "model.attn_implementation", "model.trust_remote_code")),
    "bf16": TrlName(("model.dtype",)),
    "fp16": TrlName(("model.dtype",)),
    "gradient_checkpointing": TrlName(("model.gradient_checkpointing",)),
    "peft_config": TrlName(("model.lora.enabled", "model.lora.rank"), "and model.lora.alpha, .dropout, "
                           ".target_modules"),
    # vLLM
    "use_vllm": TrlName(("rollout.backend",), "'engine' (the default), 'hf' or 'vllm'"),
    "vllm_mode": TrlName(("rollout.vllm.mode",), "with rollout.backend = 'vllm'"),
    "vllm_server_base_url": TrlName(("rollout.vllm.url",)),
    "vllm_gpu_memory_utilization": TrlName(("rollout.vllm.gpu_memory_utilization",)),
    "vllm_max_model_length": TrlName(("rollout.vllm.max_model_len",)),
    "vllm_enable_sleep_mode": TrlName((), "automatic where vLLM supports it"),
    "vllm_tensor_parallel_size": TrlName(()),
    "vllm_model_impl": TrlName(()),
    "vllm_structured_outputs_regex": TrlName(()),
    "vllm_server_timeout": TrlName((), "rollout.vllm.timeout_s bounds each request instead"),
    # steps, saving, logging
    "max_steps": TrlName(("train.max_steps",)),
    "num_train_epochs": TrlName((), "set train.max_steps; train.max_minutes bounds the time"),
    "seed": TrlName(("train.seed",)),
    "output_dir": TrlName(("log.out_dir",), "or --out, or Trainer(out_dir=...)"),
    "save_steps": TrlName(("checkpoint.every_steps",)),
    "save_total_limit": TrlName(("checkpoint.keep_last",)),
    "resume_from_checkpoint": TrlName((), "run tandemrl train --out DIR --resume"),
    "eval_strategy": TrlName(("eval.every_steps",)),
    "eval_steps": TrlName(("eval.every_steps",)),
    "per_device_eval_batch_size": TrlName(("eval.batch_size",)),
    "metric_for_best_model": TrlName(("eval.metric",)),
    "logging_steps": TrlName((), "every step is logged to metrics.jsonl"),
    "report_to": TrlName(("log.tensorboard", "log.wandb_project")),
    "log_completions": TrlName(("log.print_completions_every",)),
    "num_completions_to_print": TrlName(("log.num_completions_to_print",)),
    "max_tool_calling_iterations": TrlName(("tools.max_turns",)),
}


def trl_hint(name: str) -> str | None:
    """"TRL's learning_rate is tandemrl's train.lr" for a TRL ``GRPOConfig`` name; None for any other name."""
    entry = TRL_NAMES.get(name)
    if entry is None:
        return None
    if entry.keys:
        text = f"TRL's {name} is tandemrl's {_either(entry.keys)}"
    else:
        text = f"TRL's {name} has no tandemrl key"
    return f"{text}: {entry.note}" if entry.note else text


def _either(keys: tuple[str, ...]) -> str:
    """"a", "a or b", "a, b or c"."""
    return keys[0] if len(keys) == 1 else f"{', '.join(keys[:-1])} or {keys[-1]}"
