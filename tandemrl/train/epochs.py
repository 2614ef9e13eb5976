"""What happens when a pass over the train set ends: the curriculum re-buckets, an evaluation on the fixed held-out
set may run, the best checkpoint is kept, and early stopping is decided."""

from __future__ import annotations

from collections.abc import Callable

from tandemrl.curriculum.report import report_table, write_report
from tandemrl.telemetry.progress import TrainDisplay
from tandemrl.telemetry.writers import MultiWriter
from tandemrl.train.evaluate import EvalResult
from tandemrl.train.setup import Run, TrainerState
from tandemrl.train.state_io import save_run


def end_of_epoch(run: Run, state: TrainerState, writers: MultiWriter, display: TrainDisplay,
                 evaluate_now: Callable[[], EvalResult]) -> None:
    epoch = run.train_prompts.epoch + 1  # epochs finished so far
    if run.curriculum is not None:
        report = run.curriculum.end_epoch(epoch)
        if run.parallel.is_main:  # torchrun: every rank holds the same curriculum (loop.py); one writes it
            write_report(run.out_dir, report)
        display.print(report_table(report))
        writers.write(state.step, report.metrics())
    every = run.cfg.eval.every_epochs
    if every and epoch % every == 0:
        result = evaluate_now()
        writers.write(state.step, {**result.metrics(), "eval/epoch": epoch})
        track_best(run, state, result.score, display)


def track_best(run: Run, state: TrainerState, score: float, display: TrainDisplay) -> None:
    """A new best ``eval.metric`` saves checkpoints/best/; ``eval.early_stop_patience`` evaluations without one
    stop the run (``state.stopped_early``)."""
    if state.best_eval is None or score > state.best_eval:
        state.best_eval, state.best_step, state.evals_since_best = score, state.step, 0
        path = save_run(run, state, best=True)
        display.print(f"step {state.step}: new best eval {run.metric} {score:.4f}, saved {path}")
        return
    state.evals_since_best += 1
    patience = run.cfg.eval.early_stop_patience
    if patience and state.evals_since_best >= patience:
        state.stopped_early = True
        display.print(f"step {state.step}: {state.evals_since_best} epoch evaluations without beating "
                      f"{state.best_eval:.4f} (step {state.best_step}): stopping early (eval.early_stop_patience)",
                      style="yellow")
