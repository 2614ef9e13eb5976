"""The EMA tracker and the curriculum: epoch means in, buckets and rollouts per prompt out, exact resume."""

import json

import numpy as np
import pytest

from tandemrl.config import CurriculumConfig
from tandemrl.curriculum import Curriculum
from tandemrl.curriculum.ema import RewardEMA
from tandemrl.curriculum.report import report_table, write_report


def test_ema_first_epoch_as_is_then_decayed_unseen_half():
    ema = RewardEMA(decay=0.7)
    ema.record([1, 1, 2], [1.0, 0.0, 1.0])
    ema.record([1], [None])  # a failed reward is skipped
    assert ema.end_epoch() == 2
    assert ema.value(1) == 0.5 and ema.value(2) == 1.0 and ema.value(3) == 0.5  # 3: unseen
    ema.record([1, 1], [1.0, 1.0])
    ema.end_epoch()
    assert ema.value(1) == pytest.approx(0.7 * 0.5 + 0.3 * 1.0)
    assert ema.value(2) == 1.0  # not seen this epoch: unchanged


def bimodal_curriculum(n=120):
    cur = Curriculum(CurriculumConfig(enabled=True), list(range(n)), default_rollouts=8)
    rng = np.random.default_rng(0)
    # the first third is hard (rewards near 0.1), the rest easy (near 0.9)
    rewards = [float(np.clip(rng.normal(0.1 if i < n // 3 else 0.9, 0.03), 0, 1)) for i in range(n)]
    return cur, rewards


def test_before_the_first_epoch_every_prompt_gets_the_default():
    cur, _ = bimodal_curriculum()
    assert {cur.rollouts_for(i) for i in range(120)} == {8}


def test_hard_prompts_get_more_rollouts_after_an_epoch(tmp_path):
    cur, rewards = bimodal_curriculum()
    cur.record(list(range(120)), rewards)
    report = cur.end_epoch(1)
    assert [b.label for b in report.buckets] == ["hard", "easy"] and report.method == "kde"
    assert [b.n for b in report.buckets] == [40, 80]
    hard, easy = report.buckets
    assert hard.rollouts == round(4 * (1 + 1.5 * (1 - hard.mean_reward))) and hard.rollouts >= 9
    assert easy.rollouts == round(4 * (1 + 1.5 * (1 - easy.mean_reward))) and easy.rollouts <= 5
    assert cur.rollouts_for(0) == hard.rollouts and cur.rollouts_for(119) == easy.rollouts
    path = write_report(tmp_path, report)
    assert path == tmp_path / "curriculum" / "epoch-001.json"
    saved = json.loads(path.read_text())
    assert saved["boundaries"] == report.boundaries and [b["n"] for b in saved["buckets"]] == [40, 80]
    assert set(saved["buckets"][0]) >= {"label", "n", "percent", "rollouts"} and "mean" in saved["global"]
    assert report_table(report).row_count == 2


def test_all_equal_rewards_give_one_bucket_without_error():
    cur = Curriculum(CurriculumConfig(enabled=True), list(range(30)), default_rollouts=8)
    cur.record(list(range(30)), [1.0] * 30)
    report = cur.end_epoch(1)
    assert len(report.buckets) == 1 and report.method == "all rewards equal"
    assert report.buckets[0].rollouts == 7  # minmax of equal values is 0.5 everywhere: 4 * (1 + 1.5 * 0.5)


def test_resume_restores_ema_and_buckets_exactly():
    cur, rewards = bimodal_curriculum()
    cur.record(list(range(120)), rewards)
    cur.end_epoch(1)
    cur.record(list(range(60)), [0.5] * 60)  # half of epoch 2: pending sums must survive the save too
    saved = json.loads(json.dumps(cur.state_dict()))  # through JSON, as the checkpoint stores it
    again = Curriculum(CurriculumConfig(enabled=True), list(range(120)), default_rollouts=8)
    again.load_state_dict(saved)
    assert again.state_dict() == cur.state_dict()
    assert [again.rollouts_for(i) for i in range(120)] == [cur.rollouts_for(i) for i in range(120)]
    for c in (cur, again):
        c.record(list(range(60, 120)), [0.2] * 60)
    assert again.end_epoch(2) == cur.end_epoch(2)
    assert again.state_dict() == cur.state_dict()


def test_resume_with_other_settings_or_data_is_refused():
    cur, rewards = bimodal_curriculum()
    cur.record(list(range(120)), rewards)
    cur.end_epoch(1)
    other = Curriculum(CurriculumConfig(enabled=True, ema_decay=0.5), list(range(120)), default_rollouts=8)
    with pytest.raises(ValueError, match="curriculum.ema_decay"):
        other.load_state_dict(cur.state_dict())
    fewer = Curriculum(CurriculumConfig(enabled=True), list(range(50)), default_rollouts=8)
    with pytest.raises(ValueError, match="not in the train set"):
        fewer.load_state_dict(cur.state_dict())


def test_a_never_drawn_sample_sits_in_the_middle_without_stretching_the_scale():
    cur = Curriculum(CurriculumConfig(enabled=True), list(range(121)), default_rollouts=8)
    rng = np.random.default_rng(0)
    rewards = [float(np.clip(rng.normal(0.01 if i < 40 else 0.05, 0.003), 0, 1)) for i in range(120)]
    cur.record(list(range(120)), rewards)  # sample 120 is never drawn (its EMA stays unseen_reward, 0.5)
    report = cur.end_epoch(1)
    assert [b.n for b in report.buckets] == [40, 81] and report.method == "kde"
    hard, easy = report.buckets
    assert hard.rollouts >= 9  # the seen rewards span the whole scale: 0.5 would have squeezed them near 0
    assert cur.rollouts_for(120) == easy.rollouts  # normalised 0.5: above the hard valley, in the upper bucket
    assert report.global_stats["unseen"] == 1 and report.global_stats["max"] < 0.1
    assert "1 never drawn" in report_table(report).title
