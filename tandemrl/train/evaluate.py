"""Held-out evaluation: greedy accuracy and reward, plus pass@k from k sampled completions per prompt."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tandemrl.backends.base import RolloutBackend
from tandemrl.config import Config
from tandemrl.distributed.parallel import Parallel, SingleProcess
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


@dataclass
class _PromptScore:
    """One test prompt's greedy result (and pass@k), the unit the engines of a torchrun job share."""

    correct: bool | None  # None where the data has no `answer` column
    reward: float | None
    components: dict[str, float | None]
    length: int
    passed: bool | None  # eval.pass_k > 0: whether any of the k samples was correct


def evaluate(
    backend: RolloutBackend,
    encoder: PromptEncoder,
    samples: list[Sample],
    reward: CompositeReward,
    cfg: Config,
    policy_version: int,
    agent: AgentLoop | None = None,
    metric: str = "accuracy",
    parallel: Parallel | None = None,
) -> EvalResult:
    """Scores ``samples``; under torchrun (``parallel``) each engine scores its share of them and every rank gets the
    result over all of them."""
    parallel = parallel or SingleProcess()
    scores = parallel.all_shares(_score_prompts(backend, encoder, parallel.eval_share(samples), reward, cfg,
                                                policy_version, agent))
    has_answer = any(s.correct is not None for s in scores)
    passed = [s.passed for s in scores if s.passed is not None]
    return EvalResult(
        accuracy=_mean([s.correct for s in scores]) if has_answer else None,
        reward=_mean([s.reward for s in scores]),
        pass_at_k=_mean(passed) if passed else None,
        k=cfg.eval.pass_k,
        num_prompts=len(samples),
        response_length=_mean([s.length for s in scores]),
        components={name: _mean([s.components[name] for s in scores]) for name in reward.names},
        metric=metric,
    )


def _score_prompts(backend: RolloutBackend, encoder: PromptEncoder, samples: list[Sample], reward: CompositeReward,
                   cfg: Config, policy_version: int, agent: AgentLoop | None) -> list[_PromptScore]:
    greedy = SamplingParams(max_tokens=cfg.rollout.max_tokens, temperature=0.0, stop=tuple(cfg.rollout.stop))
    k = cfg.eval.pass_k
    sampled = SamplingParams(
        max_tokens=cfg.rollout.max_tokens, temperature=cfg.eval.temperature, top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k, stop=tuple(cfg.rollout.stop), seed=cfg.train.seed,
    )
    scores: list[_PromptScore] = []
    batch = max(1, cfg.eval.batch_size // max(1, k))
    with EvalProgress(len(samples), "evaluating") as progress:
        for start in range(0, len(samples), batch):
            chunk = samples[start : start + batch]
            scored = generate_and_score(backend, encoder, chunk, reward, greedy, 1, policy_version, f"eval{start}",
                                        tandem=False, agent=agent)  # the trained model alone
            passed: list[bool | None] = [None] * len(chunk)
            if k > 0 and scored.correct is not None:
                many = generate_and_score(backend, encoder, chunk, reward, sampled, k, policy_version, f"pass{start}",
                                          tandem=False, agent=agent)
                passed = [any(many.correct[i * k : (i + 1) * k]) for i in range(len(chunk))]
            for i, rollout in enumerate(scored.rollouts):
                scores.append(_PromptScore(
                    correct=scored.correct[i] if scored.correct is not None else None,
                    reward=scored.reward.total[i],
                    components={name: scored.reward.components[name][i] for name in reward.names},
                    length=len(rollout.completion_ids), passed=passed[i]))
            progress.advance(len(chunk))
    return scores


def _mean(values: list[Any]) -> float:
    """The mean of the values that are not None (0.0 when there are none)."""
    xs = [float(v) for v in values if v is not None]
    return sum(xs) / len(xs) if xs else 0.0
