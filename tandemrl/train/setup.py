"""Everything a run needs, built from the config before the first step (so bad input fails early)."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from tandemrl.backends.base import RolloutBackend
from tandemrl.backends.factory import make_backend
from tandemrl.backends.hf_backend import eos_token_ids
from tandemrl.config import Config, ModelConfig
from tandemrl.curriculum import Curriculum
from tandemrl.data.iterator import PromptIterator
from tandemrl.data.loading import check_batch_fits
from tandemrl.distributed.env import RankInfo
from tandemrl.distributed.launch import make_parallel
from tandemrl.distributed.parallel import Parallel, SingleProcess
from tandemrl.models.compile import compile_training_forward
from tandemrl.models.load import load_model, load_tokenizer, resolve_device, resolve_name_or_path
from tandemrl.models.lora import LoraSettings, apply_lora
from tandemrl.rewards.composite import CompositeReward
from tandemrl.rewards.inference import InferenceReward, InferenceWeights
from tandemrl.rollout.agent_loop import AgentLoop
from tandemrl.sync.base import InProcessSync, WeightSync
from tandemrl.sync.factory import make_weight_sync
from tandemrl.train.agent_setup import run_agent_loop
from tandemrl.train.metric import resolve_metric
from tandemrl.train.inputs import RunInputs, fitting_prompts, has_answer, run_data, run_reward
from tandemrl.train.optim import build_optimizer, build_scheduler
from tandemrl.train.rollouts import PromptEncoder, prompt_encoder
from tandemrl.train.sample_log import SampleLog
from tandemrl.types import Sample


@dataclass
class TrainerState:
    """What a checkpoint must carry besides weights and optimizer to resume exactly."""

    step: int = 0
    policy_version: int = 0
    consecutive_nonfinite: int = 0
    consecutive_invalid_reward: int = 0
    flat_reward_steps: int = 0  # steps in a row in which no group's rewards differed (learning_signal.py)
    initial_eval: dict | None = None
    data: dict = field(default_factory=dict)
    seconds: float = 0.0  # wall time of the run up to this checkpoint, summed over every resume
    curriculum: dict = field(default_factory=dict)  # Curriculum.state_dict(): EMA, buckets, rollouts per sample
    best_eval: float | None = None  # the best epoch evaluation's eval.metric so far
    best_step: int | None = None
    evals_since_best: int = 0  # epoch evaluations since the best one
    stopped_early: bool = False
    final_eval: dict | None = None  # the final evaluation, once the run has finished


@dataclass
class Run:
    cfg: Config
    out_dir: Path
    device: torch.device
    model: nn.Module
    tokenizer: object
    encoder: PromptEncoder
    backend: RolloutBackend
    reward: CompositeReward
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    train_prompts: PromptIterator
    test_samples: list[Sample]
    ref_model: nn.Module | None
    agent: AgentLoop | None = None  # the multi-turn agent loop (tools); None: single-turn rollouts
    inference: InferenceReward | None = None  # reward.inference (its terms are logged even at weight 0)
    curriculum: Curriculum | None = None
    sample_log: SampleLog | None = None  # samples.jsonl (log.samples; torchrun: rank 0's samples)
    parallel: Parallel = field(default_factory=SingleProcess)  # torchrun: this rank's share and reductions
    engine_model: nn.Module | None = None  # torchrun: what the engine reads (model itself, or the shards' replica)
    engine_weights: Any = None  # torchrun: WeightGather (sharded: refreshes engine_model) or NoGather (replicated)
    reduce_gradients: Callable[[], None] | None = None  # torchrun, replicated: averages gradients over the ranks
    tool_funcs: dict[str, Callable[..., Any]] = field(default_factory=dict)  # the Python API's tools (async worker)
    reward_traceback_shown: bool = False  # a failing reward's traceback prints once per process, not every step
    sync: WeightSync = field(default_factory=InProcessSync)  # how new weights reach the rollout process
    test_origin: str = ""  # where the test samples come from, in words (the run says so at its start)
    metric: str = "accuracy"  # eval.metric, resolved
    skipped_prompts: int = 0  # rows left out for a prompt over data.max_prompt_tokens (data.long_prompts = "skip")
    rollouts: Any = None  # rollout.mode = "async": the trainer's side of the rollout worker (AsyncRollouts)


def default_out_dir(cfg: Config) -> Path:
    task = cfg.data.task_name.replace(":", "-")
    return Path("runs") / f"{task}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def load_policy(cfg: ModelConfig, device: torch.device, inputs: RunInputs | None = None) -> tuple[nn.Module, object]:
    """The model to train and its tokenizer: ``inputs.model`` (the Python API's object) or ``cfg.name_or_path``;
    with ``cfg.lora.enabled`` wrapped in a fresh LoRA adapter."""
    if inputs is not None and inputs.model is not None:
        model = inputs.model.to(device)
        tokenizer = inputs.tokenizer or load_tokenizer(cfg.name_or_path, trust_remote_code=cfg.trust_remote_code)
        if cfg.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        path = resolve_name_or_path(cfg.name_or_path, tiny_dir=cfg.tiny_dir, tiny_seed=cfg.tiny_seed)
        model = load_model(
            path, dtype=cfg.dtype, device=device, gradient_checkpointing=cfg.gradient_checkpointing,
            attn_implementation=cfg.attn_implementation, trust_remote_code=cfg.trust_remote_code,
        )
        tokenizer = load_tokenizer(path, trust_remote_code=cfg.trust_remote_code)
        if path.lower().endswith(".gguf"):  # the tokenizer's eos may have been fixed; HF generate reads the model's
            from tandemrl.models.gguf import align_generation_eos

            align_generation_eos(model, tokenizer)
    if cfg.lora.enabled:
        lora = cfg.lora
        model = apply_lora(model, LoraSettings(lora.rank, lora.alpha, lora.dropout, list(lora.target_modules)))
    return model, tokenizer


def model_context(model: nn.Module) -> int | None:
    """The model's context length (``max_position_embeddings``), where its config says."""
    config = getattr(model, "config", None)
    return getattr(config, "max_position_embeddings", None)


SMALL_MODEL_PARAMETERS = 50_000_000


def set_cpu_threads(threads: int | None, model: nn.Module, device: torch.device) -> None:
    """torch's intra-op threads on the CPU: ``threads``, or 1 for a small model (its operators take microseconds,
    so splitting them only adds synchronisation, which stalls whenever another process holds a core)."""
    if device.type != "cpu":
        return
    if threads is None and sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMETERS:
        threads = 1
    if threads is not None:
        torch.set_num_threads(threads)


def load_draft(cfg: Config, device: torch.device) -> nn.Module | None:
    """The frozen draft model of speculative decoding (rollout.speculative.method = "draft"), or None."""
    spec = cfg.rollout.speculative
    if spec.method != "draft" or spec.draft_model is None:
        return None
    path = resolve_name_or_path(spec.draft_model, tiny_dir=cfg.model.tiny_dir, tiny_seed=cfg.model.tiny_seed)
    draft = load_model(path, dtype=cfg.model.dtype, device=device, trust_remote_code=cfg.model.trust_remote_code)
    return draft.eval().requires_grad_(False)


def load_frozen(cfg: Config, device: torch.device) -> nn.Module | None:
    """Tandem's frozen model: ``tandem.frozen_model``, or a second copy of the starting model; never trained. On
    ``tandem.frozen_device``, or beside the hot model (``device``)."""
    if not cfg.tandem.enabled:
        return None
    name = cfg.tandem.frozen_model or cfg.model.name_or_path
    path = resolve_name_or_path(name, tiny_dir=cfg.model.tiny_dir, tiny_seed=cfg.model.tiny_seed)
    dtype = cfg.tandem.frozen_dtype or cfg.model.dtype
    if cfg.tandem.frozen_device is not None:
        device = resolve_device(cfg.tandem.frozen_device)
    frozen = load_model(path, dtype=dtype, device=device, trust_remote_code=cfg.model.trust_remote_code)
    return frozen.eval().requires_grad_(False)


def build_run(cfg: Config, out_dir: Path, rank: RankInfo | None = None, inputs: RunInputs | None = None) -> Run:
    """`rank` (under torchrun): the model is sharded with FSDP2 and the engine decodes a full replica of it."""
    inputs = inputs or RunInputs()
    torch.manual_seed(cfg.train.seed)
    device = rank.device if rank is not None else resolve_device(cfg.model.device)
    data = run_data(cfg, inputs)
    reward = run_reward(cfg, inputs)
    metric = resolve_metric(cfg.eval.metric, reward, has_answer(data.test))
    model, tokenizer = load_policy(cfg.model, device, inputs)
    set_cpu_threads(cfg.model.cpu_threads, model, device)
    model.train()
    # With LoRA the reference is the base model (adapter disabled); otherwise a frozen copy.
    ref_model = None
    if cfg.train.kl_beta > 0 and not cfg.model.lora.enabled:
        ref_model = copy.deepcopy(model).eval().requires_grad_(False)
    engine_model, engine_weights, reduce_gradients, tensor_parallel = model, None, None, None
    if cfg.model.compile:  # after the reference copy, which stays eager
        compile_training_forward(model, distributed=rank is not None)
    if rank is not None:  # replicated or FSDP2-sharded (distributed.strategy; train/sharding.py)
        from tandemrl.train.sharding import distribute_model

        placed = distribute_model(model, cfg.distributed.strategy, rank.world_size, device, cfg.model.lora.enabled,
                                  extra_copies=int(ref_model is not None),
                                  tensor_parallel_size=cfg.engine.tensor_parallel_size,
                                  engine_replica=cfg.rollout.backend != "server")
        engine_model, engine_weights, reduce_gradients = placed.engine_model, placed.engine_weights, \
            placed.reduce_gradients
        tensor_parallel = placed.tensor_parallel
        if rank.is_main:
            print(f"torchrun: {rank.world_size} ranks, distributed.strategy -> {placed.choice.strategy} "
                  f"({placed.choice.reason})", flush=True)
            if tensor_parallel is not None:
                size = tensor_parallel.size
                print(f"torchrun: engine.tensor_parallel_size = {size}: {rank.world_size // size} engine(s), each "
                      f"rank holding 1/{size} of the engine's weights and KV cache", flush=True)
    optimizer = build_optimizer(model, cfg.train)  # over the shards when sharded
    backend = make_backend(cfg, engine_model, tokenizer, device, draft_model=load_draft(cfg, device),
                           frozen_model=load_frozen(cfg, device), tensor_parallel=tensor_parallel)
    agent = run_agent_loop(cfg, backend, tokenizer, eos_token_ids(model, tokenizer), inputs.tools)
    encoder = prompt_encoder(cfg, tokenizer, agent, context=model_context(model))
    train_samples, skipped = fitting_prompts(encoder, data.train, cfg.data.long_prompts)
    test_samples, skipped_test = fitting_prompts(encoder, data.test, cfg.data.long_prompts)
    check_batch_fits(train_samples, cfg.rollout.prompts_per_step, "the prompts that fit data.max_prompt_tokens")
    sync = make_weight_sync(cfg, out_dir, None if rank is None else rank.rank)
    # a server that comes back at an old version gets the weights again (torchrun: no, a push takes every rank and
    # only some would ask: the stale rollouts end the job, which resumes from its last checkpoint)
    if hasattr(backend, "resync") and rank is None:
        backend.resync = lambda version: sync.push(model, version)
    return Run(
        cfg=cfg, out_dir=out_dir, device=device, model=model, tokenizer=tokenizer,
        encoder=encoder, test_origin=data.test_origin, metric=metric, skipped_prompts=skipped + skipped_test,
        backend=backend, sync=sync,
        reward=reward, optimizer=optimizer, scheduler=build_scheduler(optimizer, cfg.train),
        train_prompts=PromptIterator(train_samples, cfg.rollout.prompts_per_step, seed=cfg.train.seed),
        test_samples=test_samples, ref_model=ref_model, agent=agent, tool_funcs=inputs.tools,
        inference=InferenceReward(InferenceWeights.from_config(cfg.reward.inference),
                                  speculative=cfg.rollout.speculative.enabled),
        curriculum=(Curriculum(cfg.curriculum, [s.index for s in train_samples], cfg.rollout.group_size)
                    if cfg.curriculum.enabled else None),
        sample_log=(SampleLog(out_dir, cfg.log.sample_text_per_step)
                    if cfg.log.samples and (rank is None or rank.is_main) else None),
        parallel=make_parallel(rank, cfg.engine.tensor_parallel_size),
        engine_model=engine_model if rank is not None else None, engine_weights=engine_weights,
        reduce_gradients=reduce_gradients,
    )
