"""The update and what runs around it: evaluation, checkpoints, logs and multi-process runs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tandemrl.config.base import Section


class TrainConfig(Section):
    """The GRPO update: steps, optimizer, advantage, loss and batching. Micro-batches are packed (no padding) and
    sized by a token budget: see [the update](update.md)."""

    max_steps: int = Field(800, ge=1, description="number of steps (a rollout batch and its updates)")
    max_minutes: float | None = Field(None, gt=0, description="stop stepping after this many minutes of the run "
                                      "(resumes included), then evaluate and save as after max_steps")
    seed: int = Field(0, description="seeds sampling, data order and initialisation")
    lr: float = Field(5e-4, gt=0.0, description="AdamW learning rate (the default suits the offline demo's tiny "
                      "model; a pretrained LLM wants about 1e-6)")
    weight_decay: float = Field(0.0, ge=0.0, description="AdamW weight decay")
    adam_betas: tuple[float, float] = Field((0.9, 0.99), description="AdamW betas")
    lr_schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning-rate schedule after the warm-up (`linear` and `cosine` decay to 0 at "
        "`train.max_steps`)")
    warmup_steps: int = Field(0, ge=0, description="steps of linear warm-up from 0 to `train.lr`")
    max_grad_norm: float = Field(1.0, gt=0.0, description="clip the gradient's global norm to this")
    advantage: str = Field("grpo", description="`grpo` (reward minus the group mean, divided by the group std), "
                           "`dr_grpo` (mean-centred only) or `step_norm` (normalised over the whole step, groups "
                           "ignored); each prompt's group is normalised on its own, whatever its size")
    policy_loss: str = Field("grpo", description="the policy loss: `grpo` (the clipped surrogate plus "
                             "`train.kl_beta` times the k3 KL)")
    aggregation: str = Field("token-mean", description="how token losses become one number: `token-mean`, "
                             "`seq-mean-token-mean` or `seq-mean-token-sum-norm` (Dr.GRPO)")
    eps_low: float = Field(0.2, ge=0.0, description="clip range of the ratio: [1 - eps_low, 1 + eps_high]")
    eps_high: float = Field(0.2, ge=0.0, description="upper clip: 1 + eps_high (DAPO's clip-higher when above "
                            "eps_low)")
    kl_beta: float = Field(0.0, ge=0.0, description="weight of the k3 KL to the frozen reference (the initial "
                           "model; with LoRA the base model); 0 = no KL and no reference model")
    tis_cap: float = Field(0.0, ge=0.0, description="truncated importance sampling cap on the rollout weight; 0 = off")
    tis_mode: Literal["truncate", "mask"] = Field(
        "truncate", description="with `train.tis_cap`: `truncate` weighs each token by min(w, cap), w = "
        "exp(logp_old - logp_rollout); `mask` keeps w where 1/cap <= w <= cap and leaves the other tokens out of "
        "the loss (w = 0)")
    epochs_per_batch: int = Field(1, ge=1, description="passes over each rollout batch")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per pass (the batch is split into this many "
                              "parts)")
    max_tokens_per_micro_batch: int = Field(
        16384, ge=1, description="the update's memory knob: prompt + completion tokens per forward. Each "
        "mini-batch's rows are packed (no padding) into micro-batches of at most this many tokens (first-fit "
        "decreasing) and accumulate gradients; a row longer than the budget gets a micro-batch of its own, so a "
        "budget that fits the longest row never runs out of memory. Where a micro-batch may run on padded rows "
        "(`sdpa`/`eager` attention keeps rows padded when their dense packed mask would cost more; models that "
        "cannot pack) the padding counts too: rows x (longest prompt + longest completion). The loss does not "
        "depend on the packing")
    micro_batch_size: int | None = Field(None, ge=1, description="rows per forward instead of the token budget "
                                         "(still packed): when set it wins, and setting "
                                         "`train.max_tokens_per_micro_batch` too is an error")
    logprob_chunk_size: int = Field(1024, ge=1, description="tokens per lm_head chunk when computing log-probs")
    max_nonfinite_steps: int = Field(3, ge=1, description="stop after this many steps in a row with a NaN/inf "
                                     "loss (each one is skipped)")
    max_invalid_reward_steps: int = Field(3, ge=1, description="stop after this many steps in a row with no valid reward")

    @model_validator(mode="after")
    def _check_micro_batches(self) -> TrainConfig:
        if self.micro_batch_size is not None and self.differs_from_default("max_tokens_per_micro_batch"):
            raise ValueError("train.micro_batch_size and train.max_tokens_per_micro_batch both size the update's "
                             "micro-batches: set one of them")
        return self


class EvalConfig(Section):
    """Evaluation on the test set: greedy completions (the metric, reward and accuracy) and pass@k."""

    metric: str | None = Field(None, description="what the summary, the progress line, best-checkpoint selection "
                               "and early stopping use: `accuracy`, `reward` (the weighted total) or a reward "
                               "function, by its short name as the metrics show it (`correct`) or its entry in "
                               "`reward.functions`; unset: `accuracy` when the data has an `answer` column, else "
                               "`reward`")
    every_steps: int = Field(0, ge=0, description="evaluate every N steps; 0: only before the first and after the "
                             "last update")
    limit: int | None = Field(200, ge=1, description="score the first N test rows (unset: all)")
    pass_k: int = Field(4, ge=0, description="samples per prompt for pass@k (needs an `answer` column); 0 disables")
    temperature: float = Field(1.0, ge=0.0, description="sampling temperature of the pass@k samples")
    batch_size: int = Field(256, ge=1, description="completions generated together")
    every_epochs: int = Field(0, ge=0, description="evaluate after every N-th epoch of the train set; 0 = off")
    early_stop_patience: int = Field(0, ge=0, description="stop after N epoch evaluations without a new best; 0 = off")


class CheckpointConfig(Section):
    """Checkpoints under `<run>/checkpoints/`; one is always written at the end of a run."""

    every_steps: int = Field(200, ge=0, description="checkpoint interval in steps (0 = only at the end)")
    keep_last: int = Field(2, ge=1, description="checkpoints kept; older ones are deleted")


class LogConfig(Section):
    """What a run writes besides checkpoints (metrics.jsonl always) and what it prints."""

    out_dir: str | None = Field(None, description="the run directory; unset: runs/<task>-<timestamp>")
    tensorboard: bool | None = Field(None, description="TensorBoard event files in <run>/tb (the `tensorboard` "
                                     "extra); unset: when tensorboard is installed (the run says so when it is not); "
                                     "true without it installed is an error")
    wandb_project: str | None = Field(None, description="log metrics to this Weights & Biases project (the `wandb` "
                                      "extra)")
    samples: bool = Field(True, description="<run>/samples.jsonl: one row per rollout (reward, its components, "
                          "inference terms, finish reason)")
    sample_text_per_step: int = Field(8, ge=0, description="rows of each step's samples.jsonl that also carry the "
                                      "prompt and completion text (the first rows, i.e. whole groups first); 0 = none")
    print_completions_every: int = Field(50, ge=0, description="print a few completions (prompt, completion, "
                                         "reward) every N steps, like TRL's log_completions; 0 = never")
    num_completions_to_print: int = Field(2, ge=1, description="how many completions each print shows: the first "
                                          "rollout of each of the first groups")


class DistributedConfig(Section):
    """Multi-process runs under torchrun (read only when torchrun's RANK / WORLD_SIZE are set)."""

    backend: Literal["auto", "nccl", "gloo"] = Field("auto", description="the process group's backend; `auto`: "
                                                     "`nccl` on CUDA, `gloo` on CPU")
    timeout_s: float = Field(600.0, gt=0.0, description="seconds a collective waits for a rank that is alive but "
                             "stuck before the job fails (NCCL's watchdog and gloo alike); it must cover the longest "
                             "legitimate wait: one rank's rollouts running longer than another's, rank 0 writing a "
                             "checkpoint's full weights alone")
    heartbeat_timeout_s: float = Field(60.0, gt=0.0, description="a rank whose heartbeat (a thread beating into "
                                       "torchrun's store) stops for this long is dead, frozen or cut off: the other "
                                       "ranks end the job, naming it")
    strategy: Literal["auto", "replicate", "shard"] = Field(
        "auto", description="how ranks hold the model: `replicate` (a full copy per rank, gradients all-reduced "
        "once per optimizer step, the engine reads the trained tensors in place), `shard` (FSDP2, the engine "
        "decodes a full replica refreshed by all-gather after each update), `auto`: replicate when weights, "
        "gradients, AdamW states and a margin fit the GPU's memory (always on the CPU), else shard; LoRA always "
        "replicates")
