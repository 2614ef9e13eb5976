"""Every token records the policy version that sampled it: a step counts for the version it was launched under."""

from __future__ import annotations

from collections import Counter

import pytest

from tandemrl.types import Rollout

from tests.engine.test_engine_core import (assert_matches_reference, async_scheduling, break_reads, make_engine,
                                           prompt, req)

__all__ = ["async_scheduling"]  # the fixture, imported for the tests below


def count_launched_tokens(runner) -> Counter:
    """Tokens launched per seq_id so far (kept up to date as the runner launches)."""
    launched: Counter = Counter()
    launch = runner.launch

    def counting(plan):
        pending = launch(plan)
        for seq, n in zip(plan.seqs, plan.num_tokens):
            launched[seq.seq_id] += n
        return pending

    runner.launch = counting
    return launched


@pytest.mark.parametrize("steps_before", [1, 2, 4])
def test_a_version_bump_between_steps_splits_each_rollout_where_its_next_step_was_launched(async_scheduling,
                                                                                          steps_before):
    engine, runner = make_engine(async_scheduling=async_scheduling, decode_steps=3)
    launched = count_launched_tokens(runner)
    requests = [req(f"v{i}", prompt(4 + i), max_tokens=14, seed=i) for i in range(3)]
    ids = {}
    for q in requests:
        engine.add_request(q)
        ids[q.request_id] = len(ids)  # seq ids are handed out in order from 0
    engine.set_policy_version(3)
    done = []
    for _ in range(steps_before):
        done += engine.step()
    if async_scheduling:  # the last launch is still on the device: its tokens belong to version 3
        assert engine._in_flight is not None
    before = dict(launched)
    engine.set_policy_version(4)
    while engine.has_unfinished():
        done += engine.step()
    done.sort(key=lambda r: r.request_id)
    assert_matches_reference(requests, done)  # the versions change nothing else
    for r in done:
        split = min(before[ids[r.request_id]], len(r.completion_ids))
        assert r.token_versions() == [3] * split + [4] * (len(r.completion_ids) - split), r.request_id
        assert r.policy_version == 3  # the oldest token's
        assert r.version_runs == [(0, 3), (split, 4)]


def test_requests_added_after_a_bump_carry_the_new_version_alone():
    engine, _ = make_engine(decode_steps=2)
    engine.set_policy_version(1)
    engine.add_request(req("old", prompt(5), max_tokens=8))
    engine.step()
    engine.set_policy_version(2)
    engine.add_request(req("new", prompt(6), max_tokens=4))
    done = {}
    while engine.has_unfinished():
        done.update((r.request_id, r) for r in engine.step())
    assert done["new"].policy_version == 2 and done["new"].version_runs == []
    assert done["new"].token_versions() == [2] * 4
    assert done["old"].policy_version == 1 and done["old"].token_versions()[0] == 1
    assert done["old"].token_versions()[-1] == 2


def test_without_a_version_set_tokens_carry_the_request_version_and_abandoned_steps_run_again_under_the_new():
    engine, runner = make_engine(decode_steps=2)
    requests = [req(f"f{i}", prompt(6 + i), max_tokens=9, seed=i) for i in range(2)]
    for q in requests:
        engine.add_request(q, policy_version=7)
    done = engine.step() + engine.step()  # a prefill read back, a decode burst in flight
    launch = break_reads(runner)
    done += engine.step()
    with pytest.raises(RuntimeError, match="device lost"):
        engine.step()  # both steps in flight are abandoned: their placeholders (and version runs) go
    known = {s.request_id: s.num_completion_tokens for s in engine.scheduler.running}
    runner.launch = launch
    engine.set_policy_version(8)
    while engine.has_unfinished():
        done += engine.step()
    done.sort(key=lambda r: r.request_id)
    assert_matches_reference(requests, done)
    for r in done:
        k = known[r.request_id]
        assert r.token_versions() == [7] * k + [8] * (9 - k) and r.policy_version == 7


def test_token_versions_expand_the_runs_and_ignore_runs_past_the_completion():
    r = Rollout("r", [1], [5, 6, 7, 8], [0.0] * 4, "stop", policy_version=2, version_runs=[(0, 2), (3, 3), (6, 4)])
    assert r.token_versions() == [2, 2, 2, 3]
    assert Rollout("s", [1], [5, 6], [0.0] * 2, "stop", policy_version=5).token_versions() == [5, 5]
