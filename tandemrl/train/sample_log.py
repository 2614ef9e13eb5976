"""``<run>/samples.jsonl``: one row per rollout of every step, with its serving cost, its reward and each reward
component (the weighted inference terms included), so a single sample can be traced after the run."""

from __future__ import annotations

from pathlib import Path

from tandemrl.telemetry.writers import JsonlWriter
from tandemrl.train.rollouts import ScoredRollouts


def sample_rows(scored: ScoredRollouts) -> list[dict[str, float | int | None]]:
    """Per rollout: ``sample`` (the dataset index), ``group`` (its prompt's position in the step), ``tokens``,
    ``correct``, what serving it cost whatever reward.inference weighs (``latency_ms``, ``kv_mb`` held at the peak,
    ``cache_reuse`` ratio, ``accept_rate``), ``reward`` (the total, None if a component failed) and
    ``reward/<component>`` (the task rewards and the weighted inference terms, unweighted)."""
    rows = []
    for i, (sample, rollout) in enumerate(zip(scored.samples, scored.rollouts, strict=True)):
        stats = rollout.stats
        row: dict[str, float | int | None] = {
            "sample": sample.index, "group": scored.group_ids[i], "tokens": len(rollout.completion_ids),
            "correct": int(scored.correct[i]), "latency_ms": 1000.0 * stats.latency, "kv_mb": stats.peak_kv_mb,
            "cache_reuse": stats.cache_hit_ratio, "accept_rate": stats.acceptance_rate,
            "reward": scored.reward.total[i],
        }
        row.update({f"reward/{name}": values[i] for name, values in scored.reward.components.items()})
        rows.append(row)
    return rows


class SampleLog:
    """Appends rows to ``samples.jsonl``; on resume, rows after the checkpoint's step are dropped (like metrics)."""

    def __init__(self, out_dir: Path) -> None:
        self._writer = JsonlWriter(Path(out_dir) / "samples.jsonl")

    def write(self, step: int, scored: ScoredRollouts) -> None:
        self._writer.write_many(step, sample_rows(scored))

    def truncate_after(self, step: int) -> None:
        self._writer.truncate_after(step)

    def close(self) -> None:
        self._writer.close()
