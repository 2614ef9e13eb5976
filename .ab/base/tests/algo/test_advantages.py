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
