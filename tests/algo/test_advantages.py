import math

import pytest
import torch

from tandemrl.algo import ADVANTAGES


def _t(xs):
    return torch.tensor(xs, dtype=torch.float64)


# Two groups of 3, written out by hand (unbiased std, divisor n-1):
#   group 1: [1, 0, 0.5] mean 0.5, deviations [0.5, -0.5, 0], var (0.25+0.25+0)/2 = 0.25, std 0.5
#   group 2: [2, 2, 5]   mean 3,   deviations [-1, -1, 2],    var (1+1+4)/2 = 3,       std sqrt(3)
REWARDS = [1.0, 0.0, 0.5, 2.0, 2.0, 5.0]
ALL_VALID = torch.ones(6, dtype=torch.bool)


def test_grpo_two_groups_by_hand():
    adv = ADVANTAGES.get("grpo")(_t(REWARDS), ALL_VALID, group_size=3, eps=0.0)
    s3 = math.sqrt(3)
    torch.testing.assert_close(adv, _t([1.0, -1.0, 0.0, -1 / s3, -1 / s3, 2 / s3]))


def test_grpo_eps_is_added_to_std():
    eps = 0.1
    adv = ADVANTAGES.get("grpo")(_t(REWARDS), ALL_VALID, group_size=3, eps=eps)
    s3 = math.sqrt(3)
    want = [0.5 / 0.6, -0.5 / 0.6, 0.0, -1 / (s3 + eps), -1 / (s3 + eps), 2 / (s3 + eps)]
    torch.testing.assert_close(adv, _t(want))


def test_dr_grpo_two_groups_by_hand():
    adv = ADVANTAGES.get("dr_grpo")(_t(REWARDS), ALL_VALID, group_size=3)
    torch.testing.assert_close(adv, _t([0.5, -0.5, 0.0, -1.0, -1.0, 2.0]))


@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_invalid_samples(name):
    nan = float("nan")
    rewards = _t(
        [1.0, nan, 0.0, 0.0]  # group A: one invalid -> stats over [1, 0, 0]
        + [5.0, nan, nan, nan]  # group B: one valid -> all zero
        + [nan, nan, nan, nan]  # group C: none valid -> all zero
        + [3.0, 3.0, 3.0, 3.0]  # group D: no spread -> all zero
    )
    valid = ~torch.isnan(rewards)
    adv = ADVANTAGES.get(name)(rewards, valid, group_size=4, eps=0.0)
    assert torch.isfinite(adv).all()
    # group A: mean 1/3, deviations [2/3, -1/3, -1/3], unbiased var (4/9+1/9+1/9)/2 = 1/3
    a = [2 / 3, 0.0, -1 / 3, -1 / 3]
    if name == "grpo":
        a = [x / math.sqrt(1 / 3) for x in a]
    torch.testing.assert_close(adv, _t(a + [0.0] * 12))


def test_invalid_rewards_are_not_read():
    # the same result whatever garbage sits in invalid slots
    valid = torch.tensor([True, False, True, True])
    a = ADVANTAGES.get("grpo")(_t([1.0, 1e30, 0.0, 2.0]), valid, group_size=4)
    b = ADVANTAGES.get("grpo")(_t([1.0, -7.0, 0.0, 2.0]), valid, group_size=4)
    torch.testing.assert_close(a, b)
    assert a[1] == 0


def test_shape_and_dtype_preserved_float32():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float32)
    adv = ADVANTAGES.get("grpo")(r, torch.ones(4, dtype=torch.bool), group_size=2)
    assert adv.dtype == torch.float32 and adv.shape == (4,)


def test_bad_group_size():
    with pytest.raises(ValueError):
        ADVANTAGES.get("grpo")(_t([1.0, 2.0, 3.0]), torch.ones(3, dtype=torch.bool), group_size=2)


# --- groups of different sizes (the adaptive curriculum gives harder prompts more samples) ---------------------

UNEQUAL = [[1.0, 0.0], [0.0, 0.0, 1.0, 1.0, 0.5], [3.0, 1.0, 2.0]]  # groups of 2, 5 and 3 samples


@pytest.mark.parametrize("name", ["grpo", "dr_grpo"])
def test_unequal_groups_get_the_advantages_each_group_gets_alone(name):
    fn = ADVANTAGES.get(name)
    rewards = _t([r for group in UNEQUAL for r in group])
    ids = torch.tensor([i for i, group in enumerate(UNEQUAL) for _ in group])
    together = fn(rewards, torch.ones(len(rewards), dtype=torch.bool), group_ids=ids)
    alone = torch.cat([fn(_t(group), torch.ones(len(group), dtype=torch.bool), group_size=len(group))
                       for group in UNEQUAL])
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-12)
    # and by hand, for the group of 2: mean 0.5, unbiased std sqrt(0.5)
    if name == "grpo":
        assert together[0].item() == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-6))


def test_group_ids_need_not_be_consecutive_or_sorted():
    rewards = _t([1.0, 5.0, 0.0, 7.0])
    ids = torch.tensor([9, 2, 9, 2])  # prompt 9: [1, 0]; prompt 2: [5, 7]
    adv = ADVANTAGES.get("dr_grpo")(rewards, torch.ones(4, dtype=torch.bool), group_ids=ids)
    assert adv.tolist() == [0.5, -1.0, -0.5, 1.0]


def test_a_group_of_one_gets_zero_next_to_larger_groups():
    adv = ADVANTAGES.get("grpo")(_t([1.0, 0.0, 1.0]), torch.ones(3, dtype=torch.bool), group_ids=torch.tensor([0, 0, 1]))
    assert adv[2].item() == 0.0 and adv[0].item() > 0


def test_step_norm_normalises_over_the_whole_step():
    rewards = _t([1.0, 0.0, 0.0, 0.0, 4.0])  # mean 1, unbiased std sqrt((0+1+1+1+9)/4) = sqrt(3)
    valid = torch.ones(5, dtype=torch.bool)
    adv = ADVANTAGES.get("step_norm")(rewards, valid, group_ids=torch.tensor([0, 0, 1, 1, 1]), eps=0.0)
    torch.testing.assert_close(adv, (rewards - 1.0) / math.sqrt(3))


def test_group_size_and_group_ids_are_exclusive():
    with pytest.raises(ValueError, match="exactly one"):
        ADVANTAGES.get("grpo")(_t([1.0, 2.0]), torch.ones(2, dtype=torch.bool), 2, group_ids=torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="one id per reward"):
        ADVANTAGES.get("grpo")(_t([1.0, 2.0]), torch.ones(2, dtype=torch.bool), group_ids=torch.tensor([0]))
