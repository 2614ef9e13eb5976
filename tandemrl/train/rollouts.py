"""One rollout batch: prompts x group_size completions, scored, with group-relative advantages."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from tandemrl.algo.advantages import ADVANTAGES
from tandemrl.backends.base import RolloutBackend
from tandemrl.config import Config, RolloutConfig
from tandemrl.data.tasks import format_prompt, reward_columns
from tandemrl.rewards.composite import CompositeReward, RewardResult
from tandemrl.rewards.functions import REWARD_FUNCTIONS
from tandemrl.rewards.inference import InferenceReward
from tandemrl.rewards.state import RewardTrainerState
from tandemrl.rollout.agent_loop import AgentLoop
from tandemrl.rollout.tools import ToolContext
from tandemrl.rollout.trajectory import TrajectorySpec
from tandemrl.types import Request, Rollout, Sample, SamplingParams, Trajectory


class PromptTooLong(ValueError):
    """A prompt over the run's token limit; the message names its row."""


@dataclass
class PromptEncoder:
    """Turns task samples into prompt token ids, with or without the model's chat template. ``max_tokens``: the
    longest prompt allowed (None: no limit); a longer one raises :class:`PromptTooLong` naming its row, after
    tokenising at most ``max_tokens * max_chars_per_token`` characters of it."""

    tokenizer: object
    use_chat_template: bool
    system_prompt: str | None
    tools: list[dict[str, Any]] = field(default_factory=list)  # described through the chat template
    max_tokens: int | None = None
    max_chars_per_token: int = 64

    def encode(self, sample: Sample) -> tuple[str, list[int]]:
        text = format_prompt(sample, self.tokenizer, self.use_chat_template, self.system_prompt, self.tools)
        templated = self.use_chat_template or isinstance(sample.prompt, list)
        if self.max_tokens is not None and len(text) > self.max_tokens * self.max_chars_per_token:
            raise PromptTooLong(f"{sample.source or f'sample {sample.index}'}: the prompt has {len(text):,} "
                                f"characters, far over data.max_prompt_tokens = {self.max_tokens}")
        # A chat template already carries the special tokens it needs.
        ids = list(self.tokenizer(text, add_special_tokens=not templated)["input_ids"])
        if self.max_tokens is not None and len(ids) > self.max_tokens:
            raise PromptTooLong(f"{sample.source or f'sample {sample.index}'}: the prompt has {len(ids):,} tokens, "
                                f"more than data.max_prompt_tokens = {self.max_tokens}")
        return text, ids


def prompt_encoder(cfg: Config, tokenizer: object, agent: AgentLoop | None, context: int | None = None) -> PromptEncoder:
    """The run's prompt encoder; with tools, the chat template describes them to the model. ``context``: the
    model's context length (``max_position_embeddings``); the prompt limit is ``data.max_prompt_tokens``, else the
    context less ``rollout.max_tokens``."""
    tools = agent.tools.describe() if agent is not None else []
    limit = cfg.data.max_prompt_tokens
    if limit is None and context is not None:
        limit = max(1, context - cfg.rollout.max_tokens)
    return PromptEncoder(tokenizer, cfg.data.use_chat_template, cfg.data.system_prompt, tools, limit,
                         longest_token_chars(tokenizer))


def longest_token_chars(tokenizer: object) -> int:
    """The most characters one token can stand for (a bound for rejecting a huge prompt before tokenising it)."""
    vocab = getattr(tokenizer, "get_vocab", lambda: {})()
    return max((len(t) for t in vocab), default=64) or 64


@dataclass
class ScoredRollouts:
    samples: list[Sample]  # aligned with rollouts: each prompt's sample repeated once per rollout of it
    prompts: list[str]
    rollouts: list[Rollout]
    reward: RewardResult
    correct: list[bool] | None  # the built-in accuracy, where the data has an `answer` column
    group_ids: list[int]  # the position of each rollout's prompt in the batch: its GRPO group
    trajectories: list[Trajectory] | None = None  # multi-turn rollouts (tools); None for single-turn ones


def generate_and_score(
    backend: RolloutBackend,
    encoder: PromptEncoder,
    samples: list[Sample],
    reward: CompositeReward,
    params: SamplingParams,
    samples_per_prompt: int | Sequence[int],
    policy_version: int,
    tag: str,
    *,
    trainer_state: RewardTrainerState,
    tandem: bool = True,
    agent: AgentLoop | None = None,
    inference: InferenceReward | None = None,
) -> ScoredRollouts:
    """Sample completions and score them. ``samples_per_prompt``: one count for every prompt, or one per prompt
    (the curriculum's). With ``agent`` each completion is a multi-turn trajectory: rewards score its final turn, and
    get ``trajectory``, ``tool_calls``, ``tool_errors`` and ``tool_records`` columns. ``trainer_state``: where
    training stands, for the rewards (TRL's keyword). ``inference``: add the serving-cost terms of
    reward.inference to the reward (training; evaluation scores the task alone)."""
    batch = RolloutBatch.encode(encoder, samples, samples_per_prompt)
    if agent is None:
        rollouts = backend.generate(batch.requests(params, tag, tandem), policy_version=policy_version)
        return batch.score(rollouts, reward, trainer_state, inference)
    trajectories = run_agent(backend, agent, samples, batch.encoded, params, batch.counts, policy_version, tag)
    return batch.score([t.rollout for t in trajectories], reward, trainer_state, inference, trajectories)


@dataclass
class RolloutBatch:
    """One batch's prompts, encoded, and how many completions each gets: its requests, and its scoring once they are
    back (``generate_and_score`` in two halves, for a caller that runs the engine itself)."""

    samples: list[Sample]
    encoded: list[tuple[str, list[int]]]  # per sample: (prompt text, prompt ids)
    counts: list[int]  # per sample: its completions (its group's size)

    @classmethod
    def encode(cls, encoder: PromptEncoder, samples: list[Sample],
               samples_per_prompt: int | Sequence[int]) -> RolloutBatch:
        counts = _counts(samples_per_prompt, len(samples))
        return cls(samples, [encoder.encode(s) for s in samples], counts)

    @property
    def group_ids(self) -> list[int]:
        return [i for i, n in enumerate(self.counts) for _ in range(n)]

    def requests(self, params: SamplingParams, tag: str, tandem: bool = True) -> list[Request]:
        return [Request(f"{tag}-{i}-{j}", self.encoded[i][1], params, tandem=tandem)
                for i, n in enumerate(self.counts) for j in range(n)]

    def score(self, rollouts: list[Rollout], reward: CompositeReward, trainer_state: RewardTrainerState,
              inference: InferenceReward | None = None,
              trajectories: list[Trajectory] | None = None) -> ScoredRollouts:
        """Score the batch's rollouts (in request order); with ``trajectories`` rewards see each one's final text."""
        group_ids = self.group_ids
        expanded = [self.samples[i] for i in group_ids]
        prompts = [self.encoded[i][0] for i in group_ids]
        columns = reward_columns(expanded)
        texts = [r.text for r in rollouts]
        if trajectories is not None:
            texts = [t.final_text for t in trajectories]  # the answer; the rest is in the columns below
            columns.update(trajectory_columns(trajectories))
        # TRL's contract: the dataset's own prompts, and completions as messages when the prompts are messages
        raw_prompts = [s.prompt for s in expanded]
        completions = [as_completion(text, s.prompt) for text, s in zip(texts, expanded)]
        result = reward(raw_prompts, completions, columns, completion_ids=[r.completion_ids for r in rollouts],
                        trainer_state=trainer_state)
        if inference is not None:
            result = inference(result, rollouts)
        correct = None
        if "answer" in columns:
            accuracy = REWARD_FUNCTIONS["accuracy"](prompts=raw_prompts, completions=completions, **columns)
            correct = [a == 1.0 for a in accuracy]
        return ScoredRollouts(expanded, prompts, rollouts, result, correct, group_ids, trajectories)


def as_completion(text: str, prompt: Any) -> Any:
    """A completion as reward functions get it: text, or ``[{"role": "assistant", "content": text}]`` when the
    prompt was chat messages (TRL's conversational format)."""
    return [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text


def run_agent(backend: RolloutBackend, agent: AgentLoop, samples: list[Sample], encoded: list[tuple[str, list[int]]],
              params: SamplingParams, counts: list[int], policy_version: int, tag: str) -> list[Trajectory]:
    """Multi-turn rollouts: ``counts[i]`` trajectories of sample i's prompt, through the agent loop."""
    specs = [TrajectorySpec(f"{tag}-{i}-{j}", ids, params, ToolContext({"answer": s.answer, **s.columns}))
             for i, (s, (_, ids)) in enumerate(zip(samples, encoded)) for j in range(counts[i])]
    generating = getattr(backend, "generating", None)  # the engine backend's; a server keeps its own mode
    with generating() if generating is not None else contextlib.nullcontext():
        return agent.run(specs, policy_version)


def trajectory_columns(trajectories: list[Trajectory]) -> dict[str, list[Any]]:
    """What rewards see of each trajectory besides its final answer: the transcript, its tool calls and errors."""
    return {
        "trajectory": [t.rollout.text for t in trajectories],
        "tool_calls": [len(t.tool_calls) for t in trajectories],
        "tool_errors": [t.tool_errors for t in trajectories],
        "tool_records": [t.tool_calls for t in trajectories],
        "finish_reason": [t.rollout.finish_reason for t in trajectories],  # stop / length / max_* / error
    }


def _counts(samples_per_prompt: int | Sequence[int], prompts: int) -> list[int]:
    counts = [samples_per_prompt] * prompts if isinstance(samples_per_prompt, int) else list(samples_per_prompt)
    if len(counts) != prompts or any(n < 1 for n in counts):
        raise ValueError(f"samples per prompt must be >= 1 for each of the {prompts} prompts, got {counts}")
    return counts


def group_advantages(scored: ScoredRollouts, estimator: str) -> tuple[Tensor, Tensor]:
    """Advantages [B] within each prompt's group (groups may differ in size) and a validity mask [B]; samples
    whose reward is None get advantage 0."""
    valid = torch.tensor([t is not None for t in scored.reward.total], dtype=torch.bool)
    rewards = torch.tensor([t if t is not None else 0.0 for t in scored.reward.total], dtype=torch.float32)
    group_ids = torch.tensor(scored.group_ids, dtype=torch.long)
    return ADVANTAGES.get(estimator)(rewards, valid, group_ids=group_ids), valid


def rollout_params(cfg: RolloutConfig, seed: int | None) -> SamplingParams:
    return SamplingParams(
        max_tokens=cfg.max_tokens, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
        stop=tuple(cfg.stop), ignore_eos=cfg.ignore_eos, seed=seed,
    )


def weigh_frozen_tokens(rollouts: list[Rollout], frozen_token_weight: float) -> None:
    """Tandem: the loss weight of each token from who wrote it (1.0 for the trained model, ``frozen_token_weight``
    for the frozen one); rollouts without writers are left as they are."""
    for r in rollouts:
        if r.token_sources:
            r.loss_weights = [1.0 if hot else frozen_token_weight for hot in r.token_sources]
