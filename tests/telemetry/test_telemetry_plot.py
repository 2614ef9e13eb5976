import json

import pytest

from tandemrl.telemetry.plot import plot_run


def _write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _synthetic_rows(n=20):
    rows = []
    for step in range(1, n + 1):
        rows.append({
            "step": step,
            "reward/mean": step / n,
            "reward/std": 0.1,
            "reward/accuracy/mean": step / n,
            "reward/format/mean": 1.0,
            "accuracy": step / n,
            "loss": None if step == 3 else 1.0 / step,  # a null from a non-finite value
            "kl": 0.001 * step,
            "response_length/mean": 50 + step,
            "response_length/max": 100 + step,
        })
        if step % 5 == 0:
            rows.append({"step": step, "eval/accuracy": step / n, "eval/reward": step / n, "eval/pass@4": 0.9})
    return rows


def test_plot_run_writes_pngs(tmp_path):
    _write_rows(tmp_path / "metrics.jsonl", _synthetic_rows())
    paths = plot_run(tmp_path)
    names = sorted(p.name for p in paths)
    assert names == ["accuracy.png", "loss.png", "response_length.png", "reward.png"]
    for p in paths:
        assert p.parent == tmp_path / "plots"
        data = p.read_bytes()
        assert len(data) > 1000
        assert data[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_run_skips_plots_without_data(tmp_path):
    _write_rows(tmp_path / "metrics.jsonl", [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.4, "kl": None}])
    paths = plot_run(str(tmp_path))
    assert [p.name for p in paths] == ["loss.png"]


def test_plot_run_missing_file_names_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plot_run(tmp_path / "nope")


def test_plot_run_empty_file_names_path(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match=str(tmp_path / "metrics.jsonl").replace("\\", "\\\\")):
        plot_run(tmp_path)


def test_plot_does_not_touch_pyplot(tmp_path):
    import sys

    _write_rows(tmp_path / "metrics.jsonl", _synthetic_rows(5))
    had_pyplot = "matplotlib.pyplot" in sys.modules
    plot_run(tmp_path)
    assert ("matplotlib.pyplot" in sys.modules) == had_pyplot


def _lines(fig):
    return {line.get_label(): line for ax in fig.axes for line in ax.get_lines()}


def test_evaluations_are_markers_and_training_curves_get_a_smoothed_twin():
    from tandemrl.telemetry.plot import load_series, moving_average, run_figures

    figures = run_figures(load_series(_synthetic_rows(20)))
    accuracy = _lines(figures["accuracy.png"])
    evals = accuracy["eval accuracy (greedy)"]
    assert evals.get_linestyle() == "None" and evals.get_marker() == "s"  # points, no line between evaluations
    assert list(evals.get_xdata()) == [5, 10, 15, 20]
    assert accuracy["pass@4"].get_linestyle() == "None"
    raw, smooth = accuracy["train accuracy (sampled) (raw)"], accuracy["train accuracy (sampled) (mean of 2 steps)"]
    assert list(raw.get_ydata()) == [s / 20 for s in range(1, 21)]
    assert list(smooth.get_ydata()) == pytest.approx([0.05] + [(s - 0.5) / 20 for s in range(2, 21)])
    assert _lines(figures["reward.png"])["eval reward"].get_linestyle() == "None"
    assert "mean (mean of 2 steps)" in _lines(figures["response_length.png"])
    assert moving_average([1.0, 2.0, 3.0, 4.0], 3) == [1.0, 1.5, 2.0, 3.0]


def test_a_short_run_is_drawn_raw_only():
    from tandemrl.telemetry.plot import load_series, run_figures

    labels = set(_lines(run_figures(load_series(_synthetic_rows(5)))["accuracy.png"]))
    assert labels == {"train accuracy (sampled)", "eval accuracy (greedy)", "pass@4"}


def test_reward_components_are_drawn_only_when_there_are_several():
    from tandemrl.telemetry.plot import load_series, run_figures

    rows = _synthetic_rows(10)
    labels = set(_lines(run_figures(load_series(rows))["reward.png"]))
    assert {"accuracy (raw)", "format (raw)", "reward (raw)", "eval reward"} <= labels
    single = [{k: v for k, v in r.items() if k != "reward/format/mean"} for r in rows]
    labels = set(_lines(run_figures(load_series(single))["reward.png"]))
    assert not any(label.startswith("accuracy") for label in labels)
