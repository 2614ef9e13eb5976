"""The GRPO training loop. Each step reads top to bottom: rollout -> reward -> advantage -> loss -> step -> sync.

With the default in-process engine the sync is a no-op: the engine decodes with the trainer's own parameter
tensors, so the optimizer's in-place update is what the next rollout sees. With a separate server
(rollout.backend = "server") the sync pushes the new weights there (sync.kind; tandemrl/sync/). The vLLM backend
(rollout.backend = "vllm", colocated or a vLLM server) holds a copy: it pushes and checks the weights itself when it
is asked for a policy version it does not hold yet (tandemrl/backends/vllm/).
"""

from __future__ import annotations

import time
from contextlib import closing, nullcontext
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from rich.console import Console

from tandemrl.config import Config
from tandemrl.data.synthetic import synthetic_chance_accuracy
from tandemrl.distributed.env import RankInfo
from tandemrl.distributed.launch import process_group
from tandemrl.extras import check_run_extras
from tandemrl.rewards.composite import RewardResult
from tandemrl.rewards.composite import metrics as reward_metrics
from tandemrl.rewards.state import RewardTrainerState
from tandemrl.rollout.setup import completion_budget
from tandemrl.telemetry.completions import clipped_ratio
from tandemrl.telemetry.progress import TrainDisplay, print_summary
from tandemrl.telemetry.reward_stats import reward_stats
from tandemrl.telemetry.request_stats import request_metrics
from tandemrl.telemetry.tandem import tandem_metrics
from tandemrl.telemetry.tools import tool_metrics
from tandemrl.telemetry.timers import StepTimes, peak_memory_gb, reset_peak_memory
from tandemrl.telemetry.writers import MultiWriter, make_writers
from tandemrl.train.batch import TrainBatch, build_batch
from tandemrl.train.epochs import end_of_epoch
from tandemrl.train.evaluate import EvalResult, EvaluationError, evaluate
from tandemrl.train.interrupt import GracefulInterrupt
from tandemrl.train.learning_signal import flat_reward_streak, flat_reward_warning
from tandemrl.train.logprobs import batch_logprobs
from tandemrl.train.announce import feature_lines, unseen_tools_warning
from tandemrl.train.async_rollouts import start_async_rollouts
from tandemrl.train.rollout_jobs import draw_job, run_job
from tandemrl.train.rollouts import ScoredRollouts, group_advantages, weigh_frozen_tokens
from tandemrl.train.scored_groups import group_count
from tandemrl.train.sample_log import show_completions
from tandemrl.train.inputs import RunInputs, write_inline_datasets
from tandemrl.train.setup import Run, TrainerState, build_run
from tandemrl.train.state_io import (check_out_dir, finished_message, read_summary, restore_run, save_run,
                                     saved_eval, write_run_config, write_summary)
from tandemrl.train.update import policy_update


class TrainingError(RuntimeError):
    pass


def train(cfg: Config, out_dir: Path, resume: bool = False, console: Console | None = None,
          inputs: RunInputs | None = None) -> dict:
    """One process, or one rank of a torchrun job (then rank 0 alone writes logs, summary and the console).
    ``inputs``: the Python API's objects (model, in-memory datasets, reward callables) beside the config."""
    with process_group(cfg) as rank:
        return train_rank(cfg, out_dir, resume, console, rank, inputs)


def train_rank(cfg: Config, out_dir: Path, resume: bool, console: Console | None, rank: RankInfo | None,
               inputs: RunInputs | None = None) -> dict:
    main = rank is None or rank.is_main
    console = console or Console(quiet=not main)
    # a missing optional package stops the run here, before anything is written
    for note in check_run_extras(cfg.log.tensorboard, cfg.log.wandb_project, cfg.model.lora.enabled):
        console.print(note, style="yellow", markup=False)
    if main:
        check_out_dir(out_dir, resume)
    run = build_run(cfg, out_dir, rank, inputs)  # data, model, task errors stop here, before the run dir is written
    state = starting_state(run, resume, console)  # a refused --resume stops here too: config.toml stays the run's
    started = time.perf_counter() - state.seconds  # a resumed run's clock goes on from its checkpoint's total
    if state.final_eval is not None and not _steps_left(run, state, started):  # --resume of a finished run
        close_logs(run, MultiWriter([]))
        return finished_run(run, state, console)
    state.final_eval = None  # steps follow: the final evaluation runs again after them
    if main:
        write_run_config(out_dir, cfg)
        write_inline_datasets(out_dir, inputs)
    announce_data(run, console)
    writers = make_writers(out_dir, cfg.log.tensorboard, cfg.log.wandb_project, cfg.model_dump()) if main \
        else MultiWriter([])
    # a resumed run rewrites the steps after its checkpoint; a fresh one (initial eval still to do) all of them
    for log in (writers, run.sample_log):
        if log is not None:
            log.truncate_after(state.step if state.initial_eval is not None else -1)
    run.sync.push(run.model, state.policy_version)  # a separate server starts from the trainer's weights
    if state.initial_eval is None:
        initial = run_evaluation(run, state, console)
        state.initial_eval = initial.to_dict()
        writers.write(0, initial.metrics())
    if cfg.rollout.mode == "async":  # the rollout worker, from the same weights (tandemrl/train/async_rollouts.py)
        if cfg.rollout.max_staleness > 0 and cfg.train.tis_cap == 0:
            console.print("rollout.max_staleness > 0 without train.tis_cap: stale rollouts are used uncorrected and "
                          "learn less (docs/async.md); set train.tis_cap, e.g. 2.0", style="yellow", markup=False)
        run.rollouts = start_async_rollouts(run, state.step, state.policy_version)
        run.backend.sleep()  # the trainer's own engine only evaluates now: its cache is freed until then
    with TrainDisplay(cfg.train.max_steps, state.step, console) as display, GracefulInterrupt() as interrupt, \
            closing(run.rollouts) if run.rollouts is not None else nullcontext():  # the worker stops with the steps
        # every rank stops after the same step (a signal or the time budget may reach them at different moments)
        while state.step < cfg.train.max_steps and not run.parallel.any(
                interrupt.requested or state.stopped_early or _out_of_time(cfg, started)):
            metrics = train_step(run, state, display)
            writers.write(state.step, metrics)
            display.log_step(state.step, metrics)
            if run.train_prompts.epoch_complete:
                end_of_epoch(run, state, writers, display, partial(evaluation_or_save, run, state, console, started))
            if _due(state.step, cfg.eval.every_steps, cfg.train.max_steps):
                result = evaluation_or_save(run, state, console, started)
                writers.write(state.step, result.metrics())
                display.print(f"step {state.step}: eval {result.metric} {result.score:.4f} over "
                              f"{result.num_prompts} test prompts")
            if _due(state.step, cfg.checkpoint.every_steps, cfg.train.max_steps):
                checkpoint(run, state, started)
    if run.parallel.any(interrupt.requested):
        path = checkpoint(run, state, started)
        console.print(f"[yellow]interrupted after step {state.step} by {interrupt.signal_name}: saved {path}; "
                      f"continue with: tandemrl train --resume --out {out_dir}", soft_wrap=True)
        close_logs(run, writers)
        raise KeyboardInterrupt
    final = evaluation_or_save(run, state, console, started)
    writers.write(state.step, final.metrics())
    state.final_eval = final.to_dict()  # so that --resume of this run knows it is finished
    checkpoint(run, state, started)
    close_logs(run, writers)
    summary = build_summary(cfg, state, final, time.perf_counter() - started)
    if main:
        write_summary(out_dir, summary)
    print_summary(_headline(summary), console)
    return summary


def announce_data(run: Run, console: Console) -> None:
    """Say what the run is scored on, and what it left out: no metric should be read on other data than thought;
    then what it trains and which features are on (announce.py)."""
    console.print(f"test set: {run.test_origin}; {len(run.test_samples)} prompts scored by {run.metric} "
                  "(eval.metric)", markup=False, soft_wrap=True)
    if run.skipped_prompts:
        console.print(f"[yellow]left out {run.skipped_prompts} rows whose prompt is over data.max_prompt_tokens = "
                      f"{run.encoder.max_tokens} (data.long_prompts = 'skip')")
    for line in feature_lines(run.cfg, run.model):
        console.print(line, markup=False, soft_wrap=True)
    unseen = unseen_tools_warning(run.cfg, run.encoder, run.test_samples[0]) if run.test_samples else None
    if unseen is not None:
        console.print(unseen, style="yellow", markup=False, soft_wrap=True)


def finished_run(run: Run, state: TrainerState, console: Console) -> dict:
    """--resume of a finished run: one line, nothing written but a summary.json that a kill left missing."""
    summary = read_summary(run.out_dir)
    if summary is None:
        summary = build_summary(run.cfg, state, saved_eval(state.final_eval), state.seconds)
        if run.parallel.is_main:
            write_summary(run.out_dir, summary)
    console.print(finished_message(run.out_dir, run.cfg, state, summary), markup=False, highlight=False,
                  soft_wrap=True)
    return {**summary, "already_finished": True}


def _steps_left(run: Run, state: TrainerState, started: float) -> bool:
    """Whether the loop below would run a step (the same test)."""
    cfg = run.cfg
    return state.step < cfg.train.max_steps and not run.parallel.any(state.stopped_early or _out_of_time(cfg, started))


def close_logs(run: Run, writers: MultiWriter) -> None:
    writers.close()
    if run.sample_log is not None:
        run.sample_log.close()
    run.sync.close()
    if run.agent is not None:
        run.agent.close()


def starting_state(run: Run, resume: bool, console: Console) -> TrainerState:
    """The checkpoint's state with --resume; a fresh one otherwise, or when no save ever finished."""
    state = restore_run(run) if resume else None
    if resume and state is None:  # e.g. killed during the first save: nothing to resume, nothing lost
        console.print(f"[yellow]--resume: no complete checkpoint under {run.out_dir / 'checkpoints'}; "
                      "starting from step 0")
    return state if state is not None else TrainerState()


def checkpoint(run: Run, state: TrainerState, started: float) -> Path:
    state.seconds = time.perf_counter() - started  # so that summary.json's seconds span every resume
    return save_run(run, state)


def train_step(run: Run, state: TrainerState, display: TrainDisplay) -> dict[str, float]:
    cfg, times, started = run.cfg, StepTimes(), time.perf_counter()
    reset_peak_memory(run.device)
    with times.measure("rollout"):
        if run.rollouts is not None:  # async: the worker sampled it meanwhile (or is finishing it)
            scored, async_metrics = run.rollouts.next(state.step, state.policy_version)
        else:
            job = draw_job(run, state.step)
            scored, async_metrics = run_job(run, job, run.backend, run.agent, state.policy_version), {}
    with times.measure("prepare", sync=False):  # host work: rewards checked, advantages, the batch on the device
        weigh_frozen_tokens(scored.rollouts, cfg.tandem.frozen_token_weight)
        check_rewards(run, state, scored.reward, display)
        if run.curriculum is not None:  # torchrun: every rank's rewards, so every rank keeps the same curriculum
            records = run.parallel.all_shares(list(zip([s.index for s in scored.samples], scored.reward.total)))
            run.curriculum.record([i for i, _ in records], [r for _, r in records])
        advantages, valid = group_advantages(scored, cfg.train.advantage)
        rows = run.parallel.train_rows(len(scored.rollouts))  # engine.tensor_parallel_size > 1: this rank's share
        batch = build_batch(scored.rollouts[rows], advantages[rows], run.tokenizer.pad_token_id, run.device)
        batch.loss_mask *= valid[rows].to(run.device).unsqueeze(1)  # samples without a reward stay out of the loss
        version_lag = batch.policy_version_lag(state.policy_version)
    if run.rollouts is None:  # async: the trainer's engine sleeps from one evaluation to the next
        run.backend.sleep()  # the rollout cache is not needed while the trainer steps
    with times.measure("train"):
        attach_fixed_logprobs(run, batch)
        update = policy_update(run.model, batch, run.optimizer, run.scheduler, cfg.train,
                               cfg.rollout.temperature, completion_budget(cfg), run.parallel.global_norm,
                               run.parallel.any, run.reduce_gradients)
    if run.engine_weights is not None:  # torchrun, sharded: all-gather the new shards into the engine's weights
        with times.measure("weight_gather"):
            run.engine_weights.refresh()
    if run.rollouts is None:
        run.backend.wake()
    state.step += 1
    state.policy_version += int(update.optimizer_steps > 0)
    with times.measure("sync"):
        synced = run.sync.push(run.model, state.policy_version)
        if run.rollouts is not None:
            async_metrics.update(run.rollouts.publish(state.policy_version))
    check_nonfinite(run, state, update.skipped_nonfinite, update.optimizer_steps, display)
    with times.measure("record", sync=False):  # host work: samples.jsonl, the printed completions, the metrics
        if run.sample_log is not None:
            run.sample_log.write(state.step, scored)
        show_completions(display, cfg.log, state.step, scored)
        metrics = step_metrics(run, state, scored, update.metrics, version_lag, async_metrics, times)
        check_learning_signal(run, state, metrics, display)
    metrics.update({**synced.metrics(), **times.metrics(), "time/step": sum(times.durations.values()),
                    "time/step_wall": time.perf_counter() - started,  # all of it: with async rollouts, a step's cost
                    "memory/peak_gb": peak_memory_gb(run.device), "skipped_nonfinite": update.skipped_nonfinite})
    return run.parallel.reduce_metrics(metrics)  # torchrun: means over ranks (sums for rates, max for peaks)


def step_metrics(run: Run, state: TrainerState, scored: ScoredRollouts, update_metrics: dict[str, float],
                 version_lag: int, async_metrics: dict[str, float], times: StepTimes) -> dict[str, float]:
    """What a step's batch and update say (its timings and memory are added by the caller)."""
    cfg = run.cfg
    lengths = [len(r.completion_ids) for r in scored.rollouts]
    return {
        "step": state.step, "epoch": run.train_prompts.epoch, "policy_version": state.policy_version,
        **reward_metrics(scored.reward),
        **reward_stats(scored.reward.components, scored.reward.total, scored.group_ids),
        **clipped_ratio([r.finish_reason for r in scored.rollouts]),
        **({"accuracy": sum(scored.correct) / len(scored.correct)} if scored.correct is not None else {}),
        **update_metrics, "mismatch/policy_version_lag": version_lag,
        "response_length/mean": sum(lengths) / len(lengths), "response_length/max": max(lengths),
        "rollouts_per_prompt/mean": len(scored.rollouts) / group_count(scored),
        # async: over the worker's sampling time (the trainer's wait for it says nothing of the engine's speed)
        "tokens_per_s": sum(lengths) / max(async_metrics.get("async/sample_s") or times.durations["rollout"], 1e-9),
        **request_metrics(scored.rollouts),
        **(tandem_metrics([r.token_sources for r in scored.rollouts]) if cfg.tandem.enabled else {}),
        **(tool_metrics(scored.trajectories) if scored.trajectories is not None else {}),
        **async_metrics,
    }


def attach_fixed_logprobs(run: Run, batch: TrainBatch) -> None:
    """Log-probs that stay fixed through the update: the sampling policy's (when it is reused) and the reference's."""
    cfg = run.cfg.train
    temperature, any_rank = run.cfg.rollout.temperature, run.parallel.any
    with torch.no_grad():
        if cfg.epochs_per_batch > 1 or cfg.mini_batches > 1:
            batch.old_logprobs = batch_logprobs(run.model, batch, temperature, cfg, any_rank)
        if cfg.kl_beta > 0:
            if run.ref_model is not None:
                batch.ref_logprobs = batch_logprobs(run.ref_model, batch, temperature, cfg, any_rank)
            else:
                with run.model.disable_adapter():  # LoRA: the base model is the reference
                    batch.ref_logprobs = batch_logprobs(run.model, batch, temperature, cfg, any_rank)


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


def check_learning_signal(run: Run, state: TrainerState, metrics: dict[str, float], display: TrainDisplay) -> None:
    state.flat_reward_steps = flat_reward_streak(state.flat_reward_steps, metrics)
    warning = flat_reward_warning(state.step, state.flat_reward_steps, metrics, run.cfg.rollout.max_tokens)
    if warning is not None:
        display.print(warning, style="yellow", markup=False)


def check_rewards(run: Run, state: TrainerState, reward: RewardResult, display: TrainDisplay) -> None:
    """Reports failing reward components each step (the traceback only once) and stops the run when no sample
    has had a usable reward for train.max_invalid_reward_steps steps: the policy would otherwise update on nothing."""
    if reward.errors or reward.nonfinite_by:
        display.print(f"step {state.step + 1}: reward calls that raised {reward.errors}, "
                      f"NaN/inf values {reward.nonfinite_by}", style="yellow", markup=False)
    show_traceback_once(run, reward.first_traceback, display.print)
    invalid = all(total is None for total in reward.total)
    state.consecutive_invalid_reward = state.consecutive_invalid_reward + 1 if invalid else 0
    limit = run.cfg.train.max_invalid_reward_steps
    if state.consecutive_invalid_reward >= limit:
        culprits = reward.invalid_components() or list(reward.components)
        raise TrainingError(
            f"{state.consecutive_invalid_reward} steps in a row had no valid reward for any sample "
            f"(train.max_invalid_reward_steps = {limit}); stopping. Reward function(s) that gave no usable value: "
            f"{', '.join(culprits)} (raised: {reward.errors}, NaN/inf: {reward.nonfinite_by})"
        )


def show_traceback_once(run: Run, traceback: str | None, print_: Callable[..., None]) -> None:
    """A failing reward's traceback, the first time any (step or evaluation) has one: later ones repeat it."""
    if traceback and not run.reward_traceback_shown:
        print_(traceback, style="yellow", markup=False)
        run.reward_traceback_shown = True


def run_evaluation(run: Run, state: TrainerState, console: Console) -> EvalResult:
    """Evaluate the current weights; reward failures are reported as a training step's are (the traceback once)."""
    was_training = run.model.training
    asleep_between = run.rollouts is not None  # async: the trainer's engine wakes for evaluations only
    if asleep_between:
        run.backend.wake()
    trainer_state = RewardTrainerState(global_step=state.step, max_steps=run.cfg.train.max_steps,
                                       epoch=run.train_prompts.progress)
    result = evaluate(run.backend, run.encoder, run.test_samples, run.reward, run.cfg, state.policy_version,
                      agent=run.agent, metric=run.metric, parallel=run.parallel, trainer_state=trainer_state)
    if asleep_between:
        run.backend.sleep()
    run.model.train(was_training)
    for line in result.reward_problems():
        console.print(f"step {state.step}: {line}", style="yellow", markup=False)
    show_traceback_once(run, result.first_traceback, console.print)
    return result


def evaluation_or_save(run: Run, state: TrainerState, console: Console, started: float) -> EvalResult:
    """``run_evaluation`` after some steps: one that cannot give its eval.metric saves the steps first, so that
    fixing the reward loses no training (``--resume`` goes on from there)."""
    try:
        return run_evaluation(run, state, console)
    except EvaluationError:
        path = checkpoint(run, state, started)
        console.print(f"the evaluation after step {state.step} failed: saved {path} first; fix the reward (or "
                      "eval.metric) and continue with --resume", style="yellow", markup=False)
        raise


def build_summary(cfg: Config, state: TrainerState, final: EvalResult, seconds: float) -> dict:
    summary = {
        "initial": state.initial_eval,
        "final": final.to_dict(),
        "steps": state.step,
        "task": cfg.data.task_name,
        "metric": final.metric,
        "seconds": round(seconds, 1),
    }
    if state.best_eval is not None:  # epoch evaluations ran: checkpoints/best/ holds the best one
        summary["best_eval"], summary["best_step"] = state.best_eval, state.best_step
    if state.stopped_early:
        summary["stopped_early"] = True
    if cfg.data.task_name.startswith("synthetic:"):
        summary["chance_accuracy"] = synthetic_chance_accuracy(cfg.data.task_name.split(":", 1)[1])
    return summary


def _headline(summary: dict) -> dict:
    """What the closing table shows: the scores side by side, then the run's facts."""
    def scores(result: dict) -> dict:
        named = {result["metric"]: result["score"], "reward": result["reward"]}
        if result["accuracy"] is not None:
            named["accuracy"] = result["accuracy"]
        if result.get("pass_at_k") is not None:
            named[f"pass@{result['k']}"] = result["pass_at_k"]
        return named

    facts = {k: v for k, v in summary.items() if k not in ("initial", "final")}
    return {"initial": scores(summary["initial"]), "final": scores(summary["final"]), **facts}


def _out_of_time(cfg: Config, started: float) -> bool:
    limit = cfg.train.max_minutes
    return limit is not None and time.perf_counter() - started >= 60 * limit


def _due(step: int, every: int, last: int) -> bool:
    return every > 0 and step % every == 0 and step != last
