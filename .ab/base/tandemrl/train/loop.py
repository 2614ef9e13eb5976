"""The GRPO training loop. Each step reads top to bottom: rollout -> reward -> advantage -> loss -> step -> sync.

There is no explicit weight sync: the rollout backend decodes with the trainer's own parameter tensors, so the
optimizer's in-place update is what the next rollout sees.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from rich.console import Console

from tandemrl.config import Config
from tandemrl.data.synthetic import synthetic_chance_accuracy
from tandemrl.rewards.composite import metrics as reward_metrics
from tandemrl.telemetry.progress import TrainDisplay, print_summary
from tandemrl.telemetry.timers import StepTimes, peak_memory_gb, reset_peak_memory
from tandemrl.telemetry.writers import make_writers
from tandemrl.train.batch import TrainBatch, build_batch
from tandemrl.train.evaluate import EvalResult, evaluate
from tandemrl.train.interrupt import GracefulInterrupt
from tandemrl.train.logprobs import completion_logprobs
from tandemrl.train.rollouts import generate_and_score, group_advantages, rollout_params
from tandemrl.train.setup import Run, TrainerState, build_run
from tandemrl.train.state_io import prepare_out_dir, restore_run, save_run, write_summary
from tandemrl.train.update import policy_update


class TrainingError(RuntimeError):
    pass


def train(cfg: Config, out_dir: Path, resume: bool = False, console: Console | None = None) -> dict:
    console = console or Console()
    prepare_out_dir(out_dir, cfg, resume)
    run = build_run(cfg, out_dir)
    state = restore_run(run) if resume else TrainerState()
    writers = make_writers(out_dir, cfg.log.tensorboard, cfg.log.wandb_project, cfg.model_dump())
    writers.truncate_after(state.step)  # a resumed run rewrites the steps after its checkpoint
    started = time.perf_counter()
    if state.initial_eval is None:
        initial = run_evaluation(run, state)
        state.initial_eval = initial.to_dict()
        writers.write(0, initial.metrics())
    with TrainDisplay(cfg.train.max_steps, state.step, console) as display, GracefulInterrupt() as interrupt:
        while state.step < cfg.train.max_steps and not interrupt.requested:
            metrics = train_step(run, state, display)
            writers.write(state.step, metrics)
            display.log_step(state.step, metrics)
            if _due(state.step, cfg.eval.every_steps, cfg.train.max_steps):
                writers.write(state.step, run_evaluation(run, state).metrics())
            if _due(state.step, cfg.checkpoint.every_steps, cfg.train.max_steps):
                save_run(run, state)
    if interrupt.requested:
        path = save_run(run, state)
        console.print(f"[yellow]interrupted after step {state.step}: saved {path}; "
                      f"continue with: tandemrl train --resume --out {out_dir}")
        writers.close()
        raise KeyboardInterrupt
    final = run_evaluation(run, state)
    writers.write(state.step, final.metrics())
    save_run(run, state)
    writers.close()
    summary = build_summary(cfg, state, final, time.perf_counter() - started)
    write_summary(out_dir, summary)
    print_summary(_headline(summary), console)
    return summary


def train_step(run: Run, state: TrainerState, display: TrainDisplay) -> dict[str, float]:
    cfg, times = run.cfg, StepTimes()
    reset_peak_memory(run.device)
    prompts = run.train_prompts.next_batch()
    with times.measure("rollout"):
        params = rollout_params(cfg.rollout, seed=cfg.train.seed * 1_000_003 + state.step)
        scored = generate_and_score(run.backend, run.encoder, prompts, run.reward, params,
                                    cfg.rollout.group_size, state.policy_version, f"step{state.step}")
    if scored.reward.errors:
        display.print(f"reward errors {scored.reward.errors}; first traceback:\n{scored.reward.first_traceback}",
                      style="yellow", markup=False)
    advantages, valid = group_advantages(scored, cfg.rollout.group_size, cfg.train.advantage)
    batch = build_batch(scored.rollouts, advantages, run.tokenizer.pad_token_id, run.device)
    batch.loss_mask *= valid.to(run.device).unsqueeze(1)  # samples without a reward stay out of the loss
    run.backend.sleep()  # the rollout cache is not needed while the trainer steps
    with times.measure("train"):
        attach_fixed_logprobs(run, batch)
        update = policy_update(run.model, batch, run.optimizer, run.scheduler, cfg.train,
                               cfg.rollout.temperature, cfg.rollout.max_tokens)
    run.backend.wake()
    state.step += 1
    state.policy_version += int(update.optimizer_steps > 0)
    check_nonfinite(run, state, update.skipped_nonfinite, update.optimizer_steps, display)
    lengths = [len(r.completion_ids) for r in scored.rollouts]
    return {
        "step": state.step, "epoch": run.train_prompts.epoch, "policy_version": state.policy_version,
        **reward_metrics(scored.reward),
        "accuracy": sum(scored.correct) / len(scored.correct),
        **update.metrics,
        "response_length/mean": sum(lengths) / len(lengths), "response_length/max": max(lengths),
        "tokens_per_s": sum(lengths) / max(times.durations["rollout"], 1e-9),
        **times.metrics(), "time/step": sum(times.durations.values()),
        "memory/peak_gb": peak_memory_gb(run.device),
        "skipped_nonfinite": update.skipped_nonfinite,
    }


def attach_fixed_logprobs(run: Run, batch: TrainBatch) -> None:
    """Log-probs that stay fixed through the update: the sampling policy's (when it is reused) and the reference's."""
    cfg = run.cfg.train
    temperature, chunk = run.cfg.rollout.temperature, cfg.logprob_chunk_size
    with torch.no_grad():
        if cfg.epochs_per_batch > 1 or cfg.mini_batches > 1:
            batch.old_logprobs = completion_logprobs(run.model, batch, temperature, chunk).logprobs
        if cfg.kl_beta > 0:
            if run.ref_model is not None:
                batch.ref_logprobs = completion_logprobs(run.ref_model, batch, temperature, chunk).logprobs
            else:
                with run.model.disable_adapter():  # LoRA: the base model is the reference
                    batch.ref_logprobs = completion_logprobs(run.model, batch, temperature, chunk).logprobs


def check_nonfinite(run: Run, state: TrainerState, skipped: int, applied: int, display: TrainDisplay) -> None:
    state.consecutive_nonfinite = state.consecutive_nonfinite + 1 if skipped and not applied else 0
    if skipped:
        display.print(f"step {state.step}: {skipped} update(s) skipped: non-finite loss or gradient", style="yellow")
    if state.consecutive_nonfinite >= run.cfg.train.max_nonfinite_steps:
        raise TrainingError(
            f"{state.consecutive_nonfinite} steps in a row had a non-finite loss or gradient "
            f"(train.max_nonfinite_steps = {run.cfg.train.max_nonfinite_steps}); stopping. The last good checkpoint "
            f"is under {run.out_dir / 'checkpoints'}; try a lower train.lr"
        )


def run_evaluation(run: Run, state: TrainerState) -> EvalResult:
    was_training = run.model.training
    result = evaluate(run.backend, run.encoder, run.test_samples, run.reward, run.cfg, state.policy_version)
    run.model.train(was_training)
    return result


def build_summary(cfg: Config, state: TrainerState, final: EvalResult, seconds: float) -> dict:
    summary = {
        "initial": state.initial_eval,
        "final": final.to_dict(),
        "steps": state.step,
        "task": cfg.data.task,
        "seconds": round(seconds, 1),
    }
    if cfg.data.task.startswith("synthetic:"):
        summary["chance_accuracy"] = synthetic_chance_accuracy(cfg.data.task.split(":", 1)[1])
    return summary


def _headline(summary: dict) -> dict:
    """What the closing table shows: the scores side by side, then the run's facts."""
    def scores(result: dict) -> dict:
        named = {"accuracy": result["accuracy"], "reward": result["reward"]}
        if result.get("pass_at_k") is not None:
            named[f"pass@{result['k']}"] = result["pass_at_k"]
        return named

    facts = {k: v for k, v in summary.items() if k not in ("initial", "final")}
    return {"initial": scores(summary["initial"]), "final": scores(summary["final"]), **facts}


def _due(step: int, every: int, last: int) -> bool:
    return every > 0 and step % every == 0 and step != last
