"""``<run>/samples.jsonl``: one row per rollout of every step, with its serving cost, its reward and each reward
component (the weighted inference terms included), so a single sample can be traced after the run; the first
rollouts of each step also carry their prompt and completion text. A few completions are printed every N steps."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from tandemrl.config import LogConfig
from tandemrl.telemetry.completions import CompletionExample
from tandemrl.telemetry.writers import JsonlWriter
from tandemrl.train.rollouts import ScoredRollouts

Row = dict[str, float | int | str | None]


def completion_text(scored: ScoredRollouts, i: int) -> tuple[str, str | None]:
    """Rollout i's completion as the reward saw it (a trajectory's final answer) and, multi-turn, the transcript."""
    if scored.trajectories is not None:
        trajectory = scored.trajectories[i]
        return trajectory.final_text, trajectory.rollout.text
    return scored.rollouts[i].text, None


def sample_rows(scored: ScoredRollouts, text_rows: int = 0) -> list[Row]:
    """Per rollout: ``sample`` (the dataset index), ``group`` (its prompt's position in the step), ``tokens``,
    ``finish_reason``, ``policy_version`` and ``policy_version_last`` (the weights that sampled its first and its last
    token: they differ where a push landed while it ran), ``correct``, what serving it cost whatever
    reward.inference weighs (``latency_ms``, ``kv_mb`` held at the peak, ``cache_reuse`` ratio, ``accept_rate``),
    ``reward`` (the total, None if a component failed)
    and ``reward/<component>`` (the task rewards and the weighted inference terms, unweighted). The first
    ``text_rows`` rows (whole groups first: rows are in group order) add ``prompt`` and ``completion`` (what the
    reward saw) and, for multi-turn rollouts, ``transcript`` (every turn and tool result)."""
    rows = []
    for i, (sample, rollout) in enumerate(zip(scored.samples, scored.rollouts, strict=True)):
        stats = rollout.stats
        row: Row = {
            "sample": sample.index, "group": scored.group_ids[i], "tokens": len(rollout.completion_ids),
            "finish_reason": rollout.finish_reason, "policy_version": rollout.policy_version,
            "policy_version_last": rollout.version_runs[-1][1] if rollout.version_runs else rollout.policy_version,
            "correct": None if scored.correct is None else int(scored.correct[i]),  # None: no `answer` column
            "latency_ms": 1000.0 * stats.latency, "kv_mb": stats.peak_kv_mb,
            "cache_reuse": stats.cache_hit_ratio, "accept_rate": stats.acceptance_rate,
            "reward": scored.reward.total[i],
        }
        row.update({f"reward/{name}": values[i] for name, values in scored.reward.components.items()})
        if i < text_rows:
            completion, transcript = completion_text(scored, i)
            row.update(prompt=scored.prompts[i], completion=completion)
            if transcript is not None:
                row["transcript"] = transcript
        rows.append(row)
    return rows


def completion_examples(scored: ScoredRollouts, count: int) -> list[CompletionExample]:
    """The first rollout of each of the first ``count`` groups: different prompts, as the step sampled them."""
    firsts: dict[int, int] = {}
    for i, group in enumerate(scored.group_ids):
        if len(firsts) == count:
            break
        firsts.setdefault(group, i)
    reward = scored.reward
    return [CompletionExample(scored.prompts[i], completion_text(scored, i)[0], reward.total[i],
                              {name: values[i] for name, values in reward.components.items()})
            for i in firsts.values()]


class CompletionPrinter(Protocol):
    def print_completions(self, step: int, examples: list[CompletionExample]) -> None: ...


def show_completions(display: CompletionPrinter, log: LogConfig, step: int, scored: ScoredRollouts) -> None:
    """Every ``log.print_completions_every`` steps (0: never), ``log.num_completions_to_print`` completions."""
    every = log.print_completions_every
    if every and step % every == 0:
        display.print_completions(step, completion_examples(scored, log.num_completions_to_print))


class SampleLog:
    """Appends rows to ``samples.jsonl``; on resume, rows after the checkpoint's step are dropped (like metrics).
    ``text_per_step``: how many rows of each step carry their prompt and completion text."""

    def __init__(self, out_dir: Path, text_per_step: int = 0) -> None:
        self._writer = JsonlWriter(Path(out_dir) / "samples.jsonl", text=True)
        self.text_per_step = text_per_step

    def write(self, step: int, scored: ScoredRollouts) -> None:
        self._writer.write_many(step, sample_rows(scored, self.text_per_step))

    def truncate_after(self, step: int) -> None:
        self._writer.truncate_after(step)

    def close(self) -> None:
        self._writer.close()
