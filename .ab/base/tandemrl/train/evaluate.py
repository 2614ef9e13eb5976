"""Held-out evaluation: greedy accuracy and reward, plus pass@k from k sampled completions per prompt."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tandemrl.backends.base import RolloutBackend
from tandemrl.backends.factory import make_backend
from tandemrl.config import Config
from tandemrl.data.tasks import load_task
from tandemrl.rewards.composite import CompositeReward, build_reward
from tandemrl.telemetry.progress import EvalProgress
from tandemrl.train.rollouts import PromptEncoder, generate_and_score
from tandemrl.types import Sample, SamplingParams


@dataclass
class EvalResult:
    accuracy: float  # greedy
    reward: float  # mean greedy reward over samples whose reward is defined
    pass_at_k: float | None
    k: int
    num_prompts: int

    def metrics(self) -> dict[str, float]:
        out = {"eval/accuracy": self.accuracy, "eval/reward": self.reward}
        if self.pass_at_k is not None:
            out[f"eval/pass@{self.k}"] = self.pass_at_k
        return out

    def to_dict(self) -> dict:
        return asdict(self)


def evaluate(
    backend: RolloutBackend,
    encoder: PromptEncoder,
    samples: list[Sample],
    reward: CompositeReward,
    cfg: Config,
    policy_version: int,
) -> EvalResult:
    greedy = SamplingParams(max_tokens=cfg.rollout.max_tokens, temperature=0.0, stop=tuple(cfg.rollout.stop))
    k = cfg.eval.pass_k
    sampled = SamplingParams(
        max_tokens=cfg.rollout.max_tokens, temperature=cfg.eval.temperature, top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k, stop=tuple(cfg.rollout.stop), seed=cfg.train.seed,
    )
    correct, rewards, passed = [], [], []
    batch = max(1, cfg.eval.batch_size // max(1, k))
    with EvalProgress(len(samples), "evaluating") as progress:
        for start in range(0, len(samples), batch):
            chunk = samples[start : start + batch]
            scored = generate_and_score(backend, encoder, chunk, reward, greedy, 1, policy_version, f"eval{start}")
            correct += scored.correct
            rewards += [t for t in scored.reward.total if t is not None]
            if k > 0:
                many = generate_and_score(backend, encoder, chunk, reward, sampled, k, policy_version, f"pass{start}")
                passed += [any(many.correct[i * k : (i + 1) * k]) for i in range(len(chunk))]
            progress.advance(len(chunk))
    return EvalResult(
        accuracy=sum(correct) / len(correct),
        reward=sum(rewards) / len(rewards) if rewards else 0.0,
        pass_at_k=sum(passed) / len(passed) if k > 0 else None,
        k=k,
        num_prompts=len(samples),
    )


def evaluate_config(cfg: Config) -> EvalResult:
    """`tandemrl eval`: load the configured model and score it on the test split."""
    from tandemrl.models.load import resolve_device
    from tandemrl.train.setup import load_policy

    device = resolve_device(cfg.model.device)
    samples = load_task(cfg.data.task, cfg.data.test_split, path=cfg.data.path, limit=cfg.eval.limit,
                        seed=cfg.train.seed)
    model, tokenizer = load_policy(cfg.model, device)
    backend = make_backend(cfg, model, tokenizer, device)
    encoder = PromptEncoder(tokenizer, cfg.data.use_chat_template, cfg.data.system_prompt)
    return evaluate(backend, encoder, samples, build_reward(cfg.reward.weights), cfg, policy_version=0)
