"""Held-out evaluation: greedy accuracy and reward, plus pass@k from k sampled completions per prompt."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tandemrl.backends.base import RolloutBackend
from tandemrl.config import Config
from tandemrl.rewards.composite import CompositeReward
from tandemrl.rollout.agent_loop import AgentLoop
from tandemrl.telemetry.progress import EvalProgress
from tandemrl.train.metric import metric_value
from tandemrl.train.rollouts import PromptEncoder, generate_and_score
from tandemrl.types import Sample, SamplingParams


@dataclass
class EvalResult:
    accuracy: float | None  # greedy; None where the data has no `answer` column
    reward: float  # mean greedy reward over samples whose reward is defined
    pass_at_k: float | None
    k: int
    num_prompts: int
    response_length: float | None = None  # mean greedy completion tokens
    components: dict[str, float] = field(default_factory=dict)  # mean greedy value of each reward function
    metric: str = "accuracy"  # eval.metric: what `score` is

    @property
    def score(self) -> float:
        """The value of ``metric``: what the summary, the progress line and best-checkpoint selection use."""
        return metric_value(self.metric, self.accuracy, self.reward, self.components)

    def metrics(self) -> dict[str, float]:
        out = {"eval/reward": self.reward}
        if self.accuracy is not None:
            out["eval/accuracy"] = self.accuracy
        out.update({f"eval/reward/{name}": value for name, value in self.components.items()})
        if self.response_length is not None:
            out["eval/response_length"] = self.response_length
        if self.pass_at_k is not None:
            out[f"eval/pass@{self.k}"] = self.pass_at_k
        return out

    def to_dict(self) -> dict:
        return {**asdict(self), "score": self.score}


def evaluate(
    backend: RolloutBackend,
    encoder: PromptEncoder,
    samples: list[Sample],
    reward: CompositeReward,
    cfg: Config,
    policy_version: int,
    agent: AgentLoop | None = None,
    metric: str = "accuracy",
) -> EvalResult:
    greedy = SamplingParams(max_tokens=cfg.rollout.max_tokens, temperature=0.0, stop=tuple(cfg.rollout.stop))
    k = cfg.eval.pass_k
    sampled = SamplingParams(
        max_tokens=cfg.rollout.max_tokens, temperature=cfg.eval.temperature, top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k, stop=tuple(cfg.rollout.stop), seed=cfg.train.seed,
    )
    correct: list[bool] = []
    rewards: list[float | None] = []
    components: dict[str, list[float | None]] = {name: [] for name in reward.names}
    passed: list[bool] = []
    lengths: list[int] = []
    has_answer = True
    batch = max(1, cfg.eval.batch_size // max(1, k))
    with EvalProgress(len(samples), "evaluating") as progress:
        for start in range(0, len(samples), batch):
            chunk = samples[start : start + batch]
            scored = generate_and_score(backend, encoder, chunk, reward, greedy, 1, policy_version, f"eval{start}",
                                        tandem=False, agent=agent)  # the trained model alone
            has_answer = scored.correct is not None
            correct += scored.correct or []
            lengths += [len(r.completion_ids) for r in scored.rollouts]
            rewards += scored.reward.total
            for name in components:
                components[name] += scored.reward.components[name]
            if k > 0 and has_answer:
                many = generate_and_score(backend, encoder, chunk, reward, sampled, k, policy_version, f"pass{start}",
                                          tandem=False, agent=agent)
                passed += [any(many.correct[i * k : (i + 1) * k]) for i in range(len(chunk))]
            progress.advance(len(chunk))
    return EvalResult(
        accuracy=_mean(correct) if has_answer else None,
        reward=_mean(rewards),
        pass_at_k=_mean(passed) if passed else None,
        k=k,
        num_prompts=len(samples),
        response_length=_mean(lengths),
        components={name: _mean(values) for name, values in components.items()},
        metric=metric,
    )


def _mean(values: list[Any]) -> float:
    """The mean of the values that are not None (0.0 when there are none)."""
    xs = [float(v) for v in values if v is not None]
    return sum(xs) / len(xs) if xs else 0.0
