import json
import math
import warnings
from pathlib import Path

import pytest

from tandemrl.telemetry.writers import (
    JsonlWriter,
    MultiWriter,
    make_tensorboard_writer,
    make_writers,
    read_metrics,
    tensorboard_available,
)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_jsonl_round_trip_and_nan_to_null(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    w = JsonlWriter(path)
    w.write(1, {"reward/mean": 0.5, "loss": float("nan"), "kl": float("inf"), "epoch": 0})
    w.write(2, {"reward/mean": 0.75, "eval/accuracy": 1.0})
    w.close()
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    rows = _lines(path)  # strict JSON parse
    assert rows == [
        {"step": 1, "reward/mean": 0.5, "loss": None, "kl": None, "epoch": 0},
        {"step": 2, "reward/mean": 0.75, "eval/accuracy": 1.0},
    ]
    assert read_metrics(path) == rows


def test_jsonl_flushes_each_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    w = JsonlWriter(path)
    w.write(3, {"loss": 1.5})
    # Not closed: the row must already be on disk.
    assert _lines(path) == [{"step": 3, "loss": 1.5}]
    w.close()


def test_jsonl_accepts_tensor_and_numpy_scalars(tmp_path):
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    path = tmp_path / "metrics.jsonl"
    with JsonlWriter(path) as w:
        w.write(1, {"a": np.float32(0.25), "b": torch.tensor(2.0), "c": np.int64(4), "d": True})
    assert _lines(path) == [{"step": 1, "a": 0.25, "b": 2.0, "c": 4, "d": 1}]


def test_jsonl_rejects_non_numeric(tmp_path):
    with JsonlWriter(tmp_path / "metrics.jsonl") as w, pytest.raises(TypeError, match="bad"):
        w.write(1, {"bad": "text"})


def test_resume_appends_and_truncate_after(tmp_path):
    path = tmp_path / "metrics.jsonl"
    w = JsonlWriter(path)
    for step in range(1, 6):
        w.write(step, {"loss": float(step)})
    w.close()

    # Resume from a checkpoint at step 3: rows 4 and 5 are dropped, new rows append.
    w = JsonlWriter(path)
    assert w.truncate_after(3) == 2
    assert [r["step"] for r in _lines(path)] == [1, 2, 3]
    w.write(4, {"loss": 40.0})
    w.close()
    rows = _lines(path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["loss"] == 40.0


def test_torn_last_line_is_survived(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo')
    assert read_metrics(path) == [{"step": 1, "loss": 1.0}]
    w = JsonlWriter(path)
    w.write(2, {"loss": 2.0})
    w.close()
    assert read_metrics(path) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0}]
    w = JsonlWriter(path)
    w.truncate_after(10)  # also drops the torn line
    w.close()
    assert _lines(path) == [{"step": 1, "loss": 1.0}, {"step": 2, "loss": 2.0}]


class _Recorder:
    def __init__(self):
        self.rows = []
        self.closed = False

    def write(self, step, metrics):
        self.rows.append((step, dict(metrics)))

    def close(self):
        self.closed = True


def test_multiwriter_fans_out_and_truncates(tmp_path):
    rec = _Recorder()
    jl = JsonlWriter(tmp_path / "metrics.jsonl")
    mw = MultiWriter([jl, rec, None])
    assert len(mw) == 2
    mw.write(1, {"x": 1.0})
    mw.write(2, {"x": 2.0})
    mw.truncate_after(1)
    mw.close()
    assert rec.rows == [(1, {"x": 1.0}), (2, {"x": 2.0})]
    assert rec.closed
    assert _lines(tmp_path / "metrics.jsonl") == [{"step": 1, "x": 1.0}]


def test_make_writers_jsonl_only(tmp_path):
    mw = make_writers(tmp_path / "out", tensorboard=False, wandb_project=None, config={})
    mw.write(1, {"reward/mean": 0.1})
    mw.close()
    assert _lines(tmp_path / "out" / "metrics.jsonl") == [{"step": 1, "reward/mean": 0.1}]


@pytest.mark.skipif(not tensorboard_available(), reason="tensorboard not installed")
def test_make_writers_tensorboard(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mw = make_writers(tmp_path, tensorboard=True, wandb_project=None, config={})
    mw.write(1, {"reward/mean": 0.1, "loss": float("nan")})
    mw.close()
    assert len(mw) == 2
    assert any((tmp_path / "tb").iterdir())


def test_make_tensorboard_writer_none_without_package(tmp_path, monkeypatch):
    import tandemrl.extras as extras
    import tandemrl.telemetry.writers as writers

    monkeypatch.setattr(writers, "tensorboard_available", lambda: False)
    monkeypatch.setattr(extras, "installed", lambda package: package != "tensorboard")
    assert make_tensorboard_writer(tmp_path / "tb") is None
    # unset (None): when installed, so JSONL alone; asked for (True): one line naming the extra, nothing written
    mw = writers.make_writers(tmp_path / "unset", tensorboard=None, wandb_project=None, config={})
    assert len(mw) == 1
    mw.close()
    with pytest.raises(extras.MissingExtraError, match=r"^log.tensorboard = true but tensorboard is not installed: "
                       r"pip install 'tandemrl\[tensorboard\]'$"):
        writers.make_writers(tmp_path / "asked", tensorboard=True, wandb_project=None, config={})
    assert not (tmp_path / "asked").exists()


@pytest.mark.skipif(not tensorboard_available(), reason="tensorboard not installed")
def test_make_writers_tensorboard_when_installed(tmp_path):
    mw = make_writers(tmp_path, tensorboard=None, wandb_project=None, config={})
    assert len(mw) == 2
    mw.close()


def test_wandb_missing_is_a_clear_error(tmp_path, monkeypatch):
    import tandemrl.extras as extras

    monkeypatch.setattr(extras, "installed", lambda package: package != "wandb")
    with pytest.raises(extras.MissingExtraError, match=r"pip install 'tandemrl\[wandb\]'"):
        make_writers(tmp_path / "run", tensorboard=False, wandb_project="proj", config={})
    assert not (tmp_path / "run").exists()


def test_finite_floats_keep_precision(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with JsonlWriter(path) as w:
        w.write(7, {"lr": 1e-6, "x": math.pi})
    row = _lines(path)[0]
    assert row["lr"] == 1e-6 and row["x"] == math.pi


def test_a_full_disk_is_one_clear_error_naming_the_file(tmp_path):
    import errno

    class FullFile:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            raise OSError(errno.ENOSPC, "No space left on device")

    w = JsonlWriter(tmp_path / "metrics.jsonl")
    w.write(1, {"loss": 1.0})
    w._fh = FullFile()
    with pytest.raises(OSError, match="metrics.jsonl: the disk is full") as info:
        w.write(2, {"loss": 0.5})
    assert info.value.errno == errno.ENOSPC and str(tmp_path / "metrics.jsonl") in str(info.value)
    with pytest.raises(OSError, match="the disk is full"):  # the same error again, not a half-written retry
        w.write(3, {"loss": 0.4})
    w.close()  # nothing left to fail
    assert _lines(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": 1.0}]


@pytest.mark.skipif(not tensorboard_available(), reason="tensorboard not installed")
def test_a_full_disk_in_the_tensorboard_thread_names_the_folder(tmp_path, monkeypatch):
    import errno

    tb = make_tensorboard_writer(tmp_path / "tb")

    def full_disk():  # what the event writer's background thread hands back on the next flush
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tb._writer, "flush", full_disk)
    with pytest.raises(OSError, match="the disk is full") as info:
        tb.write(1, {"loss": 1.0})
    assert str(tmp_path / "tb") in str(info.value)
    monkeypatch.undo()
    tb.close()


def test_write_many_writes_one_row_each_with_the_step(tmp_path):
    from tandemrl.telemetry.writers import JsonlWriter, read_metrics

    writer = JsonlWriter(tmp_path / "samples.jsonl")
    writer.write_many(1, [{"sample": 3, "reward": 0.5}, {"sample": 4, "reward": float("nan")}])
    writer.write_many(2, [{"sample": 3, "reward": 1.0}])
    writer.truncate_after(1)
    writer.close()
    assert read_metrics(tmp_path / "samples.jsonl") == [{"step": 1, "sample": 3, "reward": 0.5},
                                                        {"step": 1, "sample": 4, "reward": None}]
