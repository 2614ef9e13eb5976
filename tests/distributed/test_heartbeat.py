"""The heartbeat watchdog: a rank whose counter stops is named and ends the job; a rank that left cleanly is not."""

from __future__ import annotations

import time

import torch.distributed as dist

from tandemrl.distributed.heartbeat import EXIT_STATUS, Heartbeat


def watch(store, rank: int, exits: list[tuple[int, int]], timeout_s: float = 0.6) -> Heartbeat:
    return Heartbeat(store, rank, 2, timeout_s, exit=lambda status: exits.append((rank, status))).start()


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not condition():
        time.sleep(0.05)
    return condition()


def test_a_silent_rank_is_named_and_ends_the_job(capsys):
    store, exits = dist.HashStore(), []
    watcher, silent = watch(store, 0, exits), watch(store, 1, exits)
    silent._stop.set()  # rank 1's thread stops beating without saying it is done: frozen, as far as rank 0 sees
    silent._thread.join()
    assert wait_for(lambda: exits, 5.0)
    assert exits == [(0, EXIT_STATUS)]
    err = capsys.readouterr().err
    assert "[rank 0] tandemrl: rank 1 (" in err and "has not beaten for" in err and "pid" in err
    watcher._stop.set()


def test_ranks_that_beat_or_left_cleanly_are_not_failures():
    store, exits = dist.HashStore(), []
    first, second = watch(store, 0, exits), watch(store, 1, exits)
    time.sleep(1.5)  # more than the timeout: both beat
    second.stop()  # a clean exit: "done"
    time.sleep(1.5)
    first.stop()
    assert exits == []
