import time

from tandemrl.telemetry.timers import StepTimes, Timer, peak_memory_gb, reset_peak_memory


def test_timer_measures_sleep():
    with Timer() as t:
        time.sleep(0.05)
    assert 0.04 <= t.elapsed < 1.0


def test_step_times_collects_named_durations():
    times = StepTimes()
    with times.measure("rollout"):
        time.sleep(0.02)
    with times.measure("train"):
        pass
    with times.measure("rollout"):
        time.sleep(0.02)
    m = times.pop_metrics()
    assert set(m) == {"time/rollout", "time/train"}
    assert m["time/rollout"] >= 0.035
    assert m["time/train"] < m["time/rollout"]
    assert times.metrics() == {}


def test_peak_memory_cpu():
    gb = peak_memory_gb("cpu")
    assert 0.001 < gb < 1024
    reset_peak_memory("cpu")  # no-op on CPU, must not raise
