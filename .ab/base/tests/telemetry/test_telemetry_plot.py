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
