import io

from rich.console import Console

from tandemrl.telemetry.progress import EvalProgress, TrainDisplay, format_step_line, print_summary

METRICS = {
    "reward/mean": 0.625,
    "reward/std": 0.125,
    "reward/accuracy/mean": 0.5,
    "reward/format/mean": 0.75,
    "accuracy": 0.5,
    "loss": 0.0123,
    "kl": 0.00012,
    "clip_frac": 0.05,
    "entropy": 0.84,
    "response_length/mean": 123.4,
    "tokens_per_s": 12345.0,
    "time/step": 3.456,
    "memory/peak_gb": 12.34,
}


def _console():
    buf = io.StringIO()
    return Console(file=buf, width=250), buf


def test_train_display_prints_step_line():
    console, buf = _console()
    with TrainDisplay(total_steps=4, start_step=1, console=console) as d:
        d.log_step(2, METRICS)
        d.log_step(3, {"reward/mean": 0.25})
    out = buf.getvalue()
    lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(lines) == 2
    first = lines[0]
    assert "step 2/4" in first
    assert "0.625±0.125" in first
    for frag in ("accuracy 0.5", "format 0.75", "acc 0.5", "loss 0.0123", "kl 1.20e-04", "clip 0.05",
                 "ent 0.84", "len 123", "12.3k tok/s", "3.46s", "mem 12.3G"):
        assert frag in first, frag
    assert "reward 0.25" in lines[1]
    assert "loss" not in lines[1]  # missing keys are skipped


def test_step_line_handles_missing_and_nan():
    text = format_step_line(5, {"loss": None, "kl": float("nan")}).plain
    assert text == "step 5 | loss nan | kl nan"


def test_eval_progress_and_summary():
    console, buf = _console()
    with EvalProgress(10, "eval", console=console) as p:
        p.advance(3)
        p.advance(7)
    print_summary(
        {"initial": {"eval/accuracy": 0.2, "eval/reward": 0.3}, "final": {"eval/accuracy": 0.5, "eval/reward": 0.6},
         "steps": 100},
        console=console,
    )
    out = buf.getvalue()
    assert "eval/accuracy" in out and "0.2" in out and "0.5" in out and "+0.3" in out
    assert "steps" in out and "100" in out


def test_summary_flat_keys():
    console, buf = _console()
    print_summary({"initial/accuracy": 0.1, "final/accuracy": 0.4}, console=console)
    out = buf.getvalue()
    assert "accuracy" in out and "+0.3" in out
