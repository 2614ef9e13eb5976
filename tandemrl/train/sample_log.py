"""``<run>/samples.jsonl``: one row per rollout of every step, with its reward, each reward component and each
inference term (unweighted), so a single sample's serving cost can be traced after the run."""

from __future__ import annotations

from pathlib import Path

from tandemrl.telemetry.writers import JsonlWriter
from tandemrl.train.rollouts import ScoredRollouts


def sample_rows(scored: ScoredRollouts) -> list[dict[str, float | int | None]]:
    """Per rollout: ``sample`` (the dataset index), ``group`` (its prompt's position in the step), ``tokens``,
    ``correct``, ``reward`` (the total, None if a component failed) and ``reward/<component>``."""
    rows = []
    for i, (sample, rollout) in enumerate(zip(scored.samples, scored.rollouts, strict=True)):
        row: dict[str, float | int | None] = {
            "sample": sample.index, "group": scored.group_ids[i], "tokens": len(rollout.completion_ids),
            "correct": int(scored.correct[i]), "reward": scored.reward.total[i],
        }
        row.update({f"reward/{name}": values[i] for name, values in scored.reward.components.items()})
        rows.append(row)
    return rows


class SampleLog:
    """Appends rows to ``samples.jsonl``; on resume, rows after the checkpoint's step are dropped (like metrics)."""

    def __init__(self, out_dir: Path) -> None:
        self._writer = JsonlWriter(Path(out_dir) / "samples.jsonl")

    def write(self, step: int, scored: ScoredRollouts) -> None:
        for row in sample_rows(scored):
            self._writer.write(step, row)

    def truncate_after(self, step: int) -> None:
        self._writer.truncate_after(step)

    def close(self) -> None:
        self._writer.close()
