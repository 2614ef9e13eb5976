"""Held-out evaluation: greedy accuracy and reward, plus pass@k from k sampled completions per prompt.

A reward function that fails during an evaluation is reported as in training (the calls that raised, the NaN/inf
values, the first traceback): a value no test prompt got is missing (None; null in summary.json), never 0.0, and
an ``eval.metric`` without a value stops the evaluation with an :class:`EvaluationError` that says why."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from tandemrl.backends.base import RolloutBackend
from tandemrl.config import Config
from tandemrl.distributed.parallel import Parallel, SingleProcess
from tandemrl.rewards.composite import CompositeReward, RewardResult
from tandemrl.rewards.state import RewardTrainerState
from tandemrl.rollout.agent_loop import AgentLoop
from tandemrl.telemetry.progress import EvalProgress
from tandemrl.train.metric import metric_value
from tandemrl.train.rollouts import PromptEncoder, generate_and_score
from tandemrl.types import Sample, SamplingParams


class EvaluationError(RuntimeError):
    """The evaluation cannot give its eval.metric: every test prompt's value is missing (the message says why)."""


@dataclass
class EvalResult:
    accuracy: float | None  # greedy; None where the data has no `answer` column
    reward: float | None  # mean greedy reward over samples whose reward is defined; None: no sample had one
    pass_at_k: float | None
    k: int
    num_prompts: int
    response_length: float | None = None  # mean greedy completion tokens
    components: dict[str, float | None] = field(default_factory=dict)  # mean greedy value of each reward function
    metric: str = "accuracy"  # eval.metric: what `score` is
    reward_errors: dict[str, int] = field(default_factory=dict)  # reward calls that raised / returned garbage
    reward_nonfinite: dict[str, int] = field(default_factory=dict)  # NaN/inf/overflowing values, per function
    first_traceback: str | None = field(default=None, repr=False)  # the first failing call's (not in to_dict)

    @property
    def score(self) -> float:
        """The value of ``metric``: what the summary, the progress line and best-checkpoint selection use."""
        return metric_value(self.metric, self.accuracy, self.reward, self.components)

    def metrics(self) -> dict[str, float]:
        """For the metric writers; a missing value is left out (not written as 0)."""
        out = {"eval/reward": self.reward} if self.reward is not None else {}
        if self.accuracy is not None:
            out["eval/accuracy"] = self.accuracy
        out.update({f"eval/reward/{name}": value for name, value in self.components.items() if value is not None})
        out["eval/reward/errors"] = float(sum(self.reward_errors.values()))
        out["eval/reward/nonfinite"] = float(sum(self.reward_nonfinite.values()))
        if self.response_length is not None:
            out["eval/response_length"] = self.response_length
        if self.pass_at_k is not None:
            out[f"eval/pass@{self.k}"] = self.pass_at_k
        return out

    def to_dict(self) -> dict:
        out = {**asdict(self), "score": self.score}
        del out["first_traceback"]  # summary.json keeps the counts; the traceback was printed
        return out

    def reward_problems(self) -> list[str]:
        """What went wrong with the reward functions, in words (empty when nothing did)."""
        lines = []
        if self.reward_errors or self.reward_nonfinite:
            lines.append(f"evaluation: reward calls that raised {self.reward_errors}, NaN/inf values "
                         f"{self.reward_nonfinite}")
        missing = [name for name, value in self.components.items() if value is None]
        if self.reward is None:
            lines.append(f"evaluation: no test prompt got a usable reward (reported as missing, not 0){_why(missing)}")
        elif missing:
            lines.append(f"evaluation: reward function(s) {', '.join(missing)} gave no usable value for any test "
                         "prompt (reported as missing, not 0)")
        return lines


def _why(missing: list[str]) -> str:
    return f"; reward function(s) with no usable value: {', '.join(missing)}" if missing else ""


@dataclass
class _PromptScore:
    """One test prompt's greedy result (and pass@k), the unit the engines of a torchrun job share."""

    correct: bool | None  # None where the data has no `answer` column
    reward: float | None
    components: dict[str, float | None]
    length: int
    passed: bool | None  # eval.pass_k > 0: whether any of the k samples was correct
    failures: _Failures | None = None  # on the first prompt of each batch: that batch's failed reward calls


@dataclass
class _Failures:
    """Reward failures of some calls (they are per call, not per prompt): failed calls and NaN/inf values per
    function, and the first traceback."""

    errors: dict[str, int] = field(default_factory=dict)
    nonfinite: dict[str, int] = field(default_factory=dict)
    first_traceback: str | None = None

    def add(self, other: _Failures | RewardResult) -> None:
        nonfinite = other.nonfinite_by if isinstance(other, RewardResult) else other.nonfinite
        self.errors, self.nonfinite = _summed(self.errors, other.errors), _summed(self.nonfinite, nonfinite)
        self.first_traceback = self.first_traceback or other.first_traceback


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
    trainer_state: RewardTrainerState | None = None,
) -> EvalResult:
    """Scores ``samples``; under torchrun (``parallel``) each engine scores its share of them and every rank gets the
    result over all of them. ``trainer_state``: what the reward functions get as ``trainer_state`` (the step
    evaluated); default: an untrained model's (step 0 of ``train.max_steps``)."""
    parallel = parallel or SingleProcess()
    state = trainer_state or RewardTrainerState(global_step=0, max_steps=cfg.train.max_steps, epoch=0.0)
    scores = parallel.all_shares(_score_prompts(backend, encoder, parallel.eval_share(samples), reward, cfg,
                                                policy_version, agent, state))
    has_answer = any(s.correct is not None for s in scores)
    passed = [s.passed for s in scores if s.passed is not None]
    failures = _Failures()
    for s in scores:
        if s.failures is not None:
            failures.add(s.failures)
    result = EvalResult(
        accuracy=_mean([s.correct for s in scores]) if has_answer else None,
        reward=_mean([s.reward for s in scores]),
        pass_at_k=_mean(passed) if passed else None,
        k=cfg.eval.pass_k,
        num_prompts=len(samples),
        response_length=_mean([s.length for s in scores]),
        components={name: _mean([s.components[name] for s in scores]) for name in reward.names},
        metric=metric,
        reward_errors=failures.errors,
        reward_nonfinite=failures.nonfinite,
        first_traceback=failures.first_traceback,
    )
    _check_score(result)
    return result


def _check_score(result: EvalResult) -> None:
    """Raise when ``result.metric`` has no value, saying which reward function failed and how (as training stops
    when no sample has a reward: there is no number to report, or to pick a best checkpoint by)."""
    metric = result.metric
    if metric == "accuracy" or (result.reward if metric == "reward" else result.components[metric]) is not None:
        return
    if result.num_prompts == 0:
        raise EvaluationError(f"eval.metric = {metric!r} has no value: there are no test prompts to score")
    whose = "the reward functions" if metric == "reward" else f"reward function {metric!r}"
    abstained = "each returned None (abstained)" if metric == "reward" else "it returned None (abstained)"
    why = (f"reward calls that raised {result.reward_errors}, NaN/inf values {result.reward_nonfinite}"
           if result.reward_errors or result.reward_nonfinite else f"{abstained} for all of them")
    first = f"\nThe first failing call:\n{result.first_traceback}" if result.first_traceback else ""
    raise EvaluationError(f"eval.metric = {metric!r} has no value: none of the {result.num_prompts} test prompts got "
                          f"a usable one from {whose} ({why}); fix the reward function or choose another "
                          f"eval.metric{first}")


def _score_prompts(backend: RolloutBackend, encoder: PromptEncoder, samples: list[Sample], reward: CompositeReward,
                   cfg: Config, policy_version: int, agent: AgentLoop | None,
                   trainer_state: RewardTrainerState) -> list[_PromptScore]:
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
                                        trainer_state=trainer_state, tandem=False, agent=agent)  # the trained model
            failures = _Failures()  # this batch's: they travel on its first prompt's score
            failures.add(scored.reward)
            passed: list[bool | None] = [None] * len(chunk)
            if k > 0 and scored.correct is not None:
                many = generate_and_score(backend, encoder, chunk, reward, sampled, k, policy_version, f"pass{start}",
                                          trainer_state=trainer_state, tandem=False, agent=agent)
                failures.add(many.reward)
                passed = [any(many.correct[i * k : (i + 1) * k]) for i in range(len(chunk))]
            for i, rollout in enumerate(scored.rollouts):
                scores.append(_PromptScore(
                    correct=scored.correct[i] if scored.correct is not None else None,
                    reward=scored.reward.total[i],
                    components={name: scored.reward.components[name][i] for name in reward.names},
                    length=len(rollout.completion_ids), passed=passed[i], failures=failures if i == 0 else None))
            progress.advance(len(chunk))
    return scores


def _summed(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {name: a.get(name, 0) + b.get(name, 0) for name in dict.fromkeys([*a, *b])}


def _mean(values: list[Any]) -> float | None:
    """The mean of the values that are not None; None when there are none (a missing value is not a 0)."""
    xs = [float(v) for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None
