"""Epochs on the tiny model (CPU): the curriculum between epochs and its exact resume, epoch evaluations on the fixed
held-out set, the best checkpoint, early stopping, the inference terms in the metrics and in samples.jsonl."""

import json
import signal
from pathlib import Path

import pytest

import tandemrl.train.loop as loop
from tandemrl.config import load_config
from tandemrl.train.checkpoint import find_latest
from tandemrl.train.evaluate import EvalResult
from tandemrl.train.loop import train

# wall-clock numbers (the latency term included) differ between runs; everything else must match exactly
NONDETERMINISTIC = ("time/", "tokens_per_s", "memory/", "requests/queue_s", "requests/ttft_s", "requests/latency_s",
                    "reward/inference/latency_ms")


def epoch_config(tmp_path: Path, *overrides: str):
    # 16 train samples, 4 prompts a step: an epoch is 4 steps
    return load_config(None, [
        f'model.tiny_dir="{tmp_path / "tiny"}"', "model.device=cpu", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "rollout.max_tokens=6", "data.train_limit=16", "eval.limit=8", "eval.pass_k=0",
        "checkpoint.every_steps=0", "log.tensorboard=false", *overrides,
    ])


def step_rows(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC)}
            for r in rows if "reward/mean" in r}


def test_curriculum_run_resumes_exactly_mid_epoch(tmp_path, monkeypatch):
    # the latency term depends on the wall clock: left out here, so the two runs can match exactly
    cfg = epoch_config(tmp_path, "train.max_steps=10", "curriculum.enabled=true", "reward.inference.tokens=0.05",
                       "reward.inference.kv_mb=0.01", "curriculum.min_samples=4")
    train(cfg, tmp_path / "whole")
    real_step = loop.train_step

    def interrupted_step(run, state, display):
        if state.step == 5:
            signal.raise_signal(signal.SIGINT)  # during step 6, in epoch 2: its first rewards are pending in the EMA
        return real_step(run, state, display)

    monkeypatch.setattr(loop, "train_step", interrupted_step)
    with pytest.raises(KeyboardInterrupt):
        train(cfg, tmp_path / "split")
    monkeypatch.setattr(loop, "train_step", real_step)
    train(cfg, tmp_path / "split", resume=True)

    whole, split = step_rows(tmp_path / "whole"), step_rows(tmp_path / "split")
    assert sorted(split) == list(range(1, 11))
    for step in range(7, 11):
        assert split[step] == whole[step], step
    # after epoch 1 the group sizes follow the buckets: more than one size, the first epoch's 4 no more
    assert whole[5]["rollouts_per_prompt/mean"] != 4.0 or whole[6]["rollouts_per_prompt/mean"] != 4.0
    for epoch in (1, 2):
        name = f"curriculum/epoch-{epoch:03d}.json"
        assert json.loads((tmp_path / "split" / name).read_text()) == json.loads((tmp_path / "whole" / name).read_text())
    saved = json.loads((find_latest(tmp_path / "split" / "checkpoints") / "trainer_state.json").read_text())
    assert saved["curriculum"]["ema"]["ids"] and saved["curriculum"]["bucket_rollouts"]
    # samples.jsonl: one row per rollout, the resumed run's rows not duplicated
    samples = [json.loads(line) for line in (tmp_path / "split" / "samples.jsonl").read_text().splitlines()]
    whole_samples = (tmp_path / "whole" / "samples.jsonl").read_text().splitlines()
    assert len(samples) == len(whole_samples)
    assert {"sample", "group", "tokens", "reward", "reward/accuracy", "reward/inference/generated_tokens",
            "reward/inference/kv_mb", "latency_ms", "kv_mb", "cache_reuse", "accept_rate"} <= set(samples[0])
    assert "reward/inference/latency_ms" not in samples[0]  # weight 0: not in the reward (its raw value is there)
    first = samples[0]
    assert first["reward"] == pytest.approx(first["reward/accuracy"] - 0.05 * first["reward/inference/generated_tokens"]
                                            - 0.01 * first["reward/inference/kv_mb"])


def fake_evaluations(monkeypatch, accuracies):
    """Scripted accuracies for the evaluations, in order; records the prompts each one was given."""
    seen = []

    def evaluate(backend, encoder, samples, reward, cfg, policy_version, agent=None, metric="accuracy",
                 parallel=None, trainer_state=None):
        seen.append([s.prompt for s in samples])
        return EvalResult(accuracy=accuracies[len(seen) - 1], reward=0.0, pass_at_k=None, k=0,
                          num_prompts=len(samples), metric=metric)

    monkeypatch.setattr(loop, "evaluate", evaluate)
    return seen


def test_epoch_evaluations_keep_the_best_checkpoint_and_stop_early(tmp_path, monkeypatch):
    # initial, then epochs 1..4; epoch 2 is the best; 2 more without improvement stop the run; then the final one
    seen = fake_evaluations(monkeypatch, [0.0, 0.2, 0.5, 0.4, 0.5, 0.1])
    cfg = epoch_config(tmp_path, "train.max_steps=40", "eval.every_epochs=1", "eval.early_stop_patience=2")
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 16 and summary["stopped_early"] is True  # 4 epochs of 4 steps
    assert summary["best_eval"] == 0.5 and summary["best_step"] == 8 and summary["metric"] == "accuracy"
    best = find_latest(tmp_path / "run" / "checkpoints" / "best")
    assert best.name == "step-00000008"
    assert json.loads((best / "trainer_state.json").read_text())["best_eval"] == 0.5
    assert find_latest(tmp_path / "run" / "checkpoints").name == "step-00000016"
    assert len(seen) == 6 and all(prompts == seen[0] for prompts in seen)  # one fixed held-out set
    evals = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if "eval/epoch" in line]
    assert [(r["step"], r["eval/epoch"], r["eval/accuracy"]) for r in evals] == [
        (4, 1, 0.2), (8, 2, 0.5), (12, 3, 0.4), (16, 4, 0.5)]


def test_evaluations_every_second_epoch_without_patience_run_to_max_steps(tmp_path, monkeypatch):
    seen = fake_evaluations(monkeypatch, [0.0, 0.3, 0.1, 0.2])
    cfg = epoch_config(tmp_path, "train.max_steps=9", "eval.every_epochs=2")
    summary = train(cfg, tmp_path / "run")
    assert summary["steps"] == 9 and "stopped_early" not in summary and len(seen) == 3  # initial, epoch 2, final
    assert find_latest(tmp_path / "run" / "checkpoints" / "best").name == "step-00000008"


def test_patience_needs_epoch_evaluations():
    with pytest.raises(Exception, match="eval.every_epochs"):
        load_config(None, ["eval.early_stop_patience=2"])


def test_the_acceptance_term_reads_speculative_telemetry(tmp_path):
    cfg = epoch_config(tmp_path, "train.max_steps=1", 'rollout.speculative.method="draft"',
                       'rollout.speculative.draft_model="tiny"', "reward.inference.accept=1.0",
                       "reward.inference.kv_mb=0.01")
    train(cfg, tmp_path / "run")
    row = step_rows(tmp_path / "run")[1]
    assert row["reward/inference/accept_rate/mean"] == pytest.approx(row["spec/acceptance_rate"], abs=0.3)
    assert row["reward/inference/accept_rate/mean"] > 0.5 and row["reward/inference/kv_mb/mean"] > 0
