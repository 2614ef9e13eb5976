"""One typed config: a TOML file plus `--set section.key=value` overrides, validated before any work starts."""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from tandemrl.config_sections import (CurriculumConfig, DistributedConfig, InferenceRewardConfig, Section,
                                      SyncConfig, ToolsConfig, VLLMConfig)
from tandemrl.engine.config import EngineConfig
from tandemrl.speculative.config import SpeculativeConfig
from tandemrl.tandem.config import TandemConfig


class ConfigError(ValueError):
    """A config problem, phrased for the user: names the key and what would be valid."""


class LoraConfig(Section):
    """LoRA through peft (the `lora` extra): only the adapter's weights train; the base model stays frozen."""

    enabled: bool = Field(False, description="train a LoRA adapter instead of every weight")
    rank: int = Field(16, ge=1, description="the adapter's rank r")
    alpha: int = Field(32, ge=1, description="LoRA alpha: the adapter's output is scaled by alpha / rank")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="names of the linear modules that get an adapter (default: every linear layer of a "
                    "Qwen/Llama-style decoder block)")


class ModelConfig(Section):
    """The policy model: the model that is trained and, with the default backend, samples the rollouts."""

    name_or_path: str = Field("tiny", description="hub id, local directory, or a llama.cpp `.gguf` file "
                              "(dequantised into a plain trainable model; the `gguf` extra); `\"tiny\"` builds the "
                              "project's offline Qwen2-architecture model into `model.tiny_dir` on first use")
    tiny_dir: str = Field("runs/tiny-model", description="where `\"tiny\"` is built (and reused once it exists)")
    tiny_seed: int = Field(0, description="seed of the tiny model's random initialisation")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="`auto`: bfloat16 on CUDA (float32 where the GPU has no bfloat16), float32 on CPU")
    device: str = Field("auto", description="`auto` (CUDA when available, else CPU), `cpu`, `cuda` or `cuda:N`")
    gradient_checkpointing: bool = Field(False, description="recompute activations in the backward pass: less "
                                         "memory, more time")
    attn_implementation: str | None = Field(None, description="passed to transformers' `from_pretrained` (e.g. "
                                            "`sdpa`, `eager`, `flex_attention`), or `varlen`: tandemrl's packed "
                                            "attention through torch's varlen_attn (flash attention on CUDA, no "
                                            "compilation; see docs/update.md); unset: transformers' choice")
    trust_remote_code: bool = Field(False, description="let transformers run model and tokenizer code from the "
                                    "model's repository")
    compile: bool = Field(False, description="compile the training forward with torch.compile, decoder layer by "
                          "decoder layer (regional compilation, shapes dynamic: one compile for all micro-batch "
                          "lengths; generation stays eager; single-process runs only; see docs/update.md)")
    cpu_threads: int | None = Field(None, ge=1, description="torch's CPU threads; unset: 1 for models under 50M "
                                    "parameters (a tiny model's operators are too small to split, and spinning "
                                    "threads crawl when another process holds a core), else torch's default")
    lora: LoraConfig = LoraConfig()


class DataConfig(Section):
    """The prompts: your own dataset (`data.path`) or a built-in task (`data.task`)."""

    task: str | None = Field(None, description="a built-in task: `gsm8k` (GSM8K's rows, with its instruction and "
                             "`####` answers), `arith2`, `synthetic:add|copy|add2|peek`; unset: your own dataset at "
                             "`data.path` (both unset: `synthetic:add`, the offline demo)")
    path: str | None = Field(None, description="your dataset: a .jsonl / .json / .parquet / .csv file, a folder of "
                             "`<split>.jsonl`-style files or one saved by `datasets`, or a hub dataset id (the `data` "
                             "extra); with `data.task = \"gsm8k\"`: where GSM8K is (unset: the hub's `openai/gsm8k`)")
    test_path: str | None = Field(None, description="the test set, in any form `data.path` takes; unset: the "
                                  "`data.test_split` of a folder or hub dataset, else a held-out `data.test_fraction`")
    prompt_column: str = Field("prompt", min_length=1, description="the column holding the prompt: text, or a list "
                               "of chat messages `[{role, content}]` rendered with the tokenizer's chat template; "
                               "every other column reaches the reward functions by name")
    subset: str | None = Field(None, description="a hub dataset's subset (its config name, e.g. `main`)")
    train_split: str = Field("train", description="the split trained on (folders, saved datasets, hub datasets)")
    test_split: str = Field("test", description="the split evaluated on, when the dataset has it")
    test_fraction: float = Field(0.1, gt=0.0, lt=1.0, description="with no test set given: the fraction of the "
                                 "training rows held out as the test set (at least one row); the run says so")
    split_seed: int = Field(0, description="seed of the held-out split; apart from `train.seed` so that runs with "
                            "different seeds are scored on the same rows")
    train_limit: int | None = Field(None, ge=1, description="train on the first N rows only")
    max_prompt_tokens: int | None = Field(None, ge=1, description="the longest prompt allowed, in tokens; unset: "
                                          "the model's context less `rollout.max_tokens`")
    long_prompts: Literal["error", "skip"] = Field("error", description="a prompt over `data.max_prompt_tokens`: "
                                                   "`error` names its row and stops; `skip` leaves it out and "
                                                   "counts it")
    use_chat_template: bool = Field(False, description="render text prompts as a user message with the "
                                    "tokenizer's chat template (prompts given as messages always are)")
    system_prompt: str | None = Field(None, description="a system message before each prompt (chat template only)")

    @property
    def task_name(self) -> str:
        """The run's task: `task`, else `"dataset"` (your own, at `path`), else the offline demo."""
        from tandemrl.data.loading import task_name

        return task_name(self.task, self.path)

    @model_validator(mode="after")
    def _check_prompt_settings(self) -> DataConfig:
        if self.system_prompt is not None and not self.use_chat_template and self.path is None:
            raise ValueError("data.system_prompt needs data.use_chat_template = true (a system message only exists "
                             "in the chat template)")
        held_out = [key for key in ("test_fraction", "split_seed") if getattr(self, key) != _DATA_DEFAULTS[key]]
        if self.test_path is not None and held_out:
            raise ValueError(f"data.{held_out[0]} has no effect with data.test_path set (nothing is held out): "
                             f"remove one of them")
        if self.task is not None and self.prompt_column != "prompt":  # a resolved config.toml writes the default
            raise ValueError(f"data.prompt_column applies to your own dataset; data.task = {self.task!r} has its "
                             "own columns: unset one of them")
        return self


_DATA_DEFAULTS = {name: field.default for name, field in DataConfig.model_fields.items()}


class RolloutConfig(Section):
    """How rollouts are sampled: the backend, the batch of each step and the sampling settings."""

    backend: Literal["engine", "hf", "server", "vllm"] = Field(
        "engine", description="`engine`: tandemrl's engine (paged KV cache, prefix sharing, CUDA graphs; Qwen2/2.5, "
        "Qwen3, Llama, Mistral, other architectures fall back to `hf`); `hf`: plain batched decoding; `server`: a "
        "`tandemrl serve` process at `rollout.server_url`; `vllm`: vLLM (`rollout.vllm.*`)")
    server_url: str | None = Field(None, description="the server backend: base URL of `tandemrl serve`, e.g. "
                                   "`\"http://127.0.0.1:8000\"`")
    mode: Literal["sync", "async"] = Field(
        "sync", description="`sync`: each step samples its rollouts, then updates; `async`: a rollout worker "
        "thread samples the next batches (at most `rollout.max_staleness` versions ahead) while the trainer "
        "updates: see [asynchronous RL](async.md)")
    max_staleness: int = Field(0, ge=0, description="the most versions the weights that sampled a rollout may be "
                               "behind the trainer's when it is used: the server backend refuses older ones, "
                               "`rollout.mode = \"async\"` drops them (and samples at most this many batches "
                               "ahead); 0 = on-policy")
    env_port: int | None = Field(None, ge=0, le=65535, description="`rollout.mode = \"async\"` with "
                                 "`rollout.backend = \"server\"`: take the groups from environment processes "
                                 "(`python -m tandemrl.envs`) that push them to this port of 127.0.0.1 (0: a free "
                                 "one, printed at the start) instead of sampling them itself")
    async_device: str | None = Field(None, description="`rollout.mode = \"async\"`: the device of the rollout "
                                     "worker's copy of the weights, e.g. `\"cuda:1\"`; unset: the trainer's")
    server_retries: int = Field(3, ge=0, description="attempts after the first when the server does not answer")
    server_backoff_s: float = Field(2.0, ge=0.0, description="wait before the first retry; doubles each time")
    server_timeout_s: float = Field(600.0, gt=0.0, description="seconds one rollout request may take")
    prompts_per_step: int = Field(16, ge=1, description="prompts drawn per step; each is sampled "
                                  "`rollout.group_size` times")
    group_size: int = Field(8, ge=2, description="samples per prompt; GRPO needs at least 2")
    max_tokens: int = Field(3, ge=1, description="most tokens generated per completion")
    temperature: float = Field(1.0, ge=0.0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling: keep the smallest set of tokens whose "
                         "probability reaches top_p (1 = off)")
    top_k: int = Field(0, ge=0, description="keep the k most likely tokens (0 = off)")
    stop: list[str] = Field([], description="strings that end a completion")
    ignore_eos: bool = Field(False, description="keep generating past the end-of-sequence token, up to "
                             "`rollout.max_tokens`")
    max_batch_size: int = Field(256, ge=1, description="the `hf` backend: sequences decoded together at most")
    speculative: SpeculativeConfig = SpeculativeConfig()
    vllm: VLLMConfig = VLLMConfig()

    @model_validator(mode="after")
    def _check_speculative(self) -> RolloutConfig:
        spec = self.speculative
        try:
            spec.validate()
        except ValueError as err:
            raise ValueError(str(err).replace("speculative.", "rollout.speculative.")) from None
        if spec.method == "draft" and not spec.draft_model:
            raise ValueError("rollout.speculative.method = 'draft' needs rollout.speculative.draft_model "
                             "(a hub id or a local directory)")
        if spec.enabled and self.backend != "engine":
            raise ValueError("rollout.speculative needs rollout.backend = 'engine'")
        if spec.enabled and self.temperature > 0 and (self.top_p < 1 or self.top_k > 0):
            raise ValueError("rollout.speculative samples with temperature only (the rejection rule): unset "
                             "rollout.top_p and rollout.top_k")
        return self


class RewardConfig(Section):
    """The reward: a weighted sum of reward functions (TRL's contract), plus the inference-aware terms."""

    functions: list[str] = Field(["accuracy"], description="reward functions: registered names (`accuracy`, "
                                 "`format`, `length_penalty`, `tool_use`, `tool_errors`), `package.module:function` "
                                 "or `path/to/file.py:function`; unset with `reward.weights` set: the keys of "
                                 "`reward.weights`")
    weights: dict[str, float] = Field({}, description="weight of each reward function by name (1.0 for a function "
                                      "not listed here)")
    inference: InferenceRewardConfig = InferenceRewardConfig()

    def components(self) -> dict[str, float]:
        """name -> weight of every reward function the run calls."""
        return {name: self.weights.get(name, 1.0) for name in self.functions}

    @model_validator(mode="before")
    @classmethod
    def _functions_from_weights(cls, data: Any) -> Any:
        """`reward.weights` alone names the functions too (`{accuracy = 1.0, format = 0.1}`)."""
        if isinstance(data, dict) and "functions" not in data and isinstance(data.get("weights"), dict):
            data = {**data, "functions": list(data["weights"])}
        return data

    @model_validator(mode="after")
    def _check_weights(self) -> RewardConfig:
        unused = [name for name in self.weights if name not in self.functions]
        if unused:
            raise ValueError(f"reward.weights names {unused[0]!r}, which is not in reward.functions "
                             f"({', '.join(self.functions)}): add it there or remove its weight")
        if not self.functions:
            raise ValueError("no reward function: set reward.functions (e.g. [\"accuracy\"])")
        return self


class TrainConfig(Section):
    """The GRPO update: steps, optimizer, advantage, loss and batching. Micro-batches are packed (no padding) and
    sized by a token budget: see [the update](update.md)."""

    max_steps: int = Field(800, ge=1, description="number of steps (a rollout batch and its updates)")
    max_minutes: float | None = Field(None, gt=0, description="stop stepping after this many minutes of the run "
                                      "(resumes included), then evaluate and save as after max_steps")
    seed: int = Field(0, description="seeds sampling, data order and initialisation")
    lr: float = Field(1e-3, gt=0.0, description="AdamW learning rate")
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
        # A run's config.toml writes every key: only a budget other than the default counts as set.
        budget = "max_tokens_per_micro_batch"
        if self.micro_batch_size is not None and budget in self.model_fields_set and \
                self.max_tokens_per_micro_batch != type(self).model_fields[budget].default:
            raise ValueError("train.micro_batch_size and train.max_tokens_per_micro_batch both size the update's "
                             "micro-batches: set one of them")
        return self


class EvalConfig(Section):
    """Evaluation on the test set: greedy completions (the metric, reward and accuracy) and pass@k."""

    metric: str | None = Field(None, description="what the summary, the progress line, best-checkpoint selection "
                               "and early stopping use: `accuracy`, `reward` (the weighted total) or the name of a "
                               "reward function; unset: `accuracy` when the data has an `answer` column, else "
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


class Config(Section):
    """Every setting of a run, section by section (docs/configuration.md lists each key). Build it with
    :func:`load_config` (a TOML file and ``section.key=value`` overrides) or pass a dict to ``Trainer(config=...)``."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    rollout: RolloutConfig = RolloutConfig()
    engine: EngineConfig = EngineConfig()
    tandem: TandemConfig = TandemConfig()
    tools: ToolsConfig = ToolsConfig()
    sync: SyncConfig = SyncConfig()
    reward: RewardConfig = RewardConfig()
    curriculum: CurriculumConfig = CurriculumConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    distributed: DistributedConfig = DistributedConfig()
    log: LogConfig = LogConfig()

    @model_validator(mode="after")
    def _check_engine(self) -> Config:
        try:
            self.engine.validate()
        except ValueError as err:
            raise ValueError(str(err).replace("EngineConfig.", "engine.")) from None
        return self

    @model_validator(mode="after")
    def _check_tandem(self) -> Config:
        if not self.tandem.enabled:
            return self
        try:
            self.tandem.validate()
        except ValueError as err:
            raise ValueError(str(err).replace("TandemSelectorConfig.", "tandem.")) from None
        if self.rollout.backend != "engine" or self.rollout.speculative.enabled:
            raise ValueError("tandem.enabled needs rollout.backend = 'engine' and no rollout.speculative")
        return self

    @model_validator(mode="after")
    def _check_vllm(self) -> Config:
        if self.rollout.backend == "vllm" and self.model.lora.enabled:
            raise ValueError("rollout.backend = 'vllm' does not take LoRA adapters yet (model.lora.enabled); "
                             "use rollout.backend = 'engine'")
        return self

    @model_validator(mode="after")
    def _check_tools(self) -> Config:
        from tandemrl.rollout.catalog import BUILTIN_TOOLS  # stdlib and pydantic only

        unknown = [name for name in self.tools.names if name not in BUILTIN_TOOLS]
        if unknown:
            raise ValueError(f"tools.names: unknown tool {unknown[0]!r}; built-in tools: {', '.join(BUILTIN_TOOLS)}")
        if not self.tools.active:
            return self
        if not self.tools.names:
            raise ValueError(f"tools.enabled = true but tools.names is empty (built-in tools: "
                             f"{', '.join(BUILTIN_TOOLS)})")
        if self.rollout.backend not in ("engine", "server"):
            raise ValueError("tools (multi-turn rollouts) need rollout.backend = 'engine' or 'server': the agent loop "
                             "drives the engine, or the server, request by request")
        if self.tandem.enabled or self.rollout.speculative.enabled:
            raise ValueError("tools cannot be combined with tandem.enabled or rollout.speculative yet")
        return self

    @model_validator(mode="after")
    def _check_server(self) -> Config:
        rollout, kind = self.rollout, self.sync.kind
        if rollout.backend != "server":
            if kind != "inprocess":
                raise ValueError(f"sync.kind = {kind!r} pushes weights to a separate server: it needs "
                                 "rollout.backend = 'server' (and rollout.server_url)")
            return self
        if not rollout.server_url:
            raise ValueError("rollout.backend = 'server' needs rollout.server_url (e.g. 'http://127.0.0.1:8000', "
                             "where `tandemrl serve` listens)")
        if kind == "inprocess":
            raise ValueError("rollout.backend = 'server' samples in another process: sync.kind must be one of "
                             "'checkpoint', 'lora', 'ipc', 'nccl' ('inprocess' only works with the engine here)")
        if kind == "lora" and not self.model.lora.enabled:
            raise ValueError("sync.kind = 'lora' pushes a LoRA adapter: set model.lora.enabled = true")
        if kind == "checkpoint" and self.model.lora.enabled:
            raise ValueError("sync.kind = 'checkpoint' pushes full weights; with model.lora.enabled use sync.kind = "
                             "'lora'")
        if kind == "nccl" and not (self.sync.nccl_init_method or "").startswith("tcp://"):
            raise ValueError("sync.kind = 'nccl' needs sync.nccl_init_method = 'tcp://HOST:PORT' (e.g. "
                             "'tcp://127.0.0.1:29511'), where the trainer hosts the group's store")
        if rollout.speculative.enabled or self.tandem.enabled:
            raise ValueError("rollout.backend = 'server' does not run speculative or tandem rollouts yet")
        return self

    @model_validator(mode="after")
    def _check_async(self) -> Config:
        rollout = self.rollout
        if rollout.mode != "async":
            return self
        if rollout.backend not in ("engine", "server"):
            raise ValueError(f"rollout.mode = 'async' samples with its own engine or from a `tandemrl serve` "
                             f"server: set rollout.backend = 'engine' or 'server' (got {rollout.backend!r})")
        if rollout.speculative.enabled or self.tandem.enabled:
            raise ValueError("rollout.mode = 'async' does not run speculative or tandem rollouts yet")
        if rollout.env_port is not None and rollout.backend != "server":
            raise ValueError("rollout.env_port takes groups from environments that sample from a server: set "
                             "rollout.backend = 'server' and rollout.server_url (the trainer pushes its weights there)")
        return self

    @model_validator(mode="after")
    def _check_inference_reward(self) -> Config:
        """A non-zero weight needs the telemetry its term is made of."""
        weights, engine = self.reward.inference, self.rollout.backend == "engine"
        if weights.accept and not self.rollout.speculative.enabled:
            raise ValueError("reward.inference.accept needs speculative decoding (rollout.speculative.method): "
                             "without a draft there is no acceptance rate")
        if weights.kv_mb and not engine:
            raise ValueError("reward.inference.kv_mb needs rollout.backend = 'engine': the hf backend holds no "
                             "KV blocks to measure")
        if weights.cache_reuse and not (engine and self.engine.enable_prefix_caching):
            raise ValueError("reward.inference.cache_reuse needs rollout.backend = 'engine' with "
                             "engine.enable_prefix_caching = true: otherwise there is no cache reuse to measure")
        if self.eval.early_stop_patience and not self.eval.every_epochs:
            raise ValueError("eval.early_stop_patience counts epoch evaluations: set eval.every_epochs too")
        return self

    @model_validator(mode="after")
    def _check_batching(self) -> Config:
        samples = self.rollout.prompts_per_step * self.rollout.group_size
        if samples % self.train.mini_batches:
            raise ValueError(
                f"train.mini_batches={self.train.mini_batches} must divide rollout.prompts_per_step * "
                f"rollout.group_size = {samples}"
            )
        return self

    @model_validator(mode="after")
    def _check_effects(self) -> Config:
        """Last: a key that is set but has no effect (its section switched off) is an error naming what to set."""
        from tandemrl.config_effects import check_effects, preset_keys

        check_effects(self, preset_keys(self))
        return self


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a TOML file (optional), apply `a.b=c` overrides, validate everything."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_toml(Path(path))
    for item in overrides or []:
        _apply_override(raw, item)
    return validate_config(raw)


def validate_config(raw: dict[str, Any]) -> Config:
    """The config from the user's keys; the task's own defaults (tandemrl/data/task_defaults.py) fill the keys the
    user left out."""
    from tandemrl.data.task_defaults import with_task_defaults

    data = raw.get("data")
    task = data.get("task", DataConfig.model_fields["task"].default) if isinstance(data, dict) else None
    raw = with_task_defaults(raw, task)
    _check_registered_names(raw)
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_describe(err)) from None


def config_to_toml(cfg: Config) -> str:
    """Resolved config as TOML (None values are left out: TOML has no null)."""
    lines: list[str] = []
    _emit_table(cfg.model_dump(), [], lines)
    return "\n".join(lines).strip() + "\n"


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects section.key=value, got {item!r}")
    parts = key.strip().split(".")
    node = raw
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {item!r}: {part!r} is a value, not a section")
    node[parts[-1]] = _parse_value(text.strip())


def _parse_value(text: str) -> Any:
    """TOML literal if it parses (3, 1e-4, true, [..], "x"), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _check_registered_names(raw: dict[str, Any]) -> None:
    # Imported here: algorithm registries pull in torch, which the config module itself should not need.
    from tandemrl.algo.advantages import ADVANTAGES
    from tandemrl.algo.losses import AGGREGATIONS, POLICY_LOSSES

    train = raw.get("train", {})
    if not isinstance(train, dict):
        return
    for key, registry in (("advantage", ADVANTAGES), ("aggregation", AGGREGATIONS), ("policy_loss", POLICY_LOSSES)):
        if key in train and train[key] not in registry.names():
            raise ConfigError(
                f"train.{key} = {train[key]!r} is not known; valid choices: {', '.join(registry.names())}"
            )


def _describe(err: ValidationError) -> str:
    messages = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "config"
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            messages.append(_unknown_key_message(e["loc"]))
        elif e["type"] == "value_error":  # our own checks: their messages name the keys
            messages.append(str(e.get("ctx", {}).get("error", e["msg"])))
        else:
            messages.append(f"{key}: {e['msg']} (got {e.get('input')!r})")
    if len(messages) == 1:  # one problem, one line
        return f"invalid config: {messages[0]}"
    return "invalid config:\n  " + "\n  ".join(messages)


def _unknown_key_message(loc: tuple[Any, ...]) -> str:
    section: type = Config
    for part in loc[:-1]:
        field = _field_names(section).get(str(part))
        if field is None or not _field_names(field):
            break
        section = field
    valid = list(_field_names(section))
    key = ".".join(str(p) for p in loc)
    hint = difflib.get_close_matches(str(loc[-1]), valid, n=1)
    suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
    return f"unknown config key {key!r}{suggestion}; valid keys here: {', '.join(valid)}"


def _field_names(section: Any) -> dict[str, Any]:
    """A section's keys and their types: a pydantic model's fields or a dataclass's ({} for a plain value)."""
    if isinstance(section, type) and issubclass(section, BaseModel):
        return {name: f.annotation for name, f in section.model_fields.items()}
    if dataclasses.is_dataclass(section):
        return {f.name: f.type for f in dataclasses.fields(section)}
    return {}


def _emit_table(table: dict[str, Any], prefix: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict) and v is not None}
    sections = {k: v for k, v in table.items() if isinstance(v, dict)}
    if prefix and (scalars or not sections):
        lines.append(f"\n[{'.'.join(prefix)}]")
    for key, value in scalars.items():
        lines.append(f"{_toml_key(key)} = {toml_literal(value)}")
    for key, value in sections.items():
        _emit_table(value, prefix + [key], lines)


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else toml_literal(key)


def toml_literal(value: Any) -> str:
    """A value as a TOML literal (an inline table for a dict)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} to TOML")
