import pytest

from tandemrl.telemetry.reward_stats import reward_stats


def test_mean_and_std_per_function_skip_abstentions():
    stats = reward_stats({"acc": [1.0, 0.0, None, 1.0], "fmt": [0.5, 0.5, 0.5, 0.5]}, [1.5, 0.5, None, 1.5],
                         [0, 0, 1, 1])
    assert stats["reward/acc/mean"] == pytest.approx(2 / 3)
    assert stats["reward/acc/std"] == pytest.approx((2 / 9) ** 0.5)  # population std of 1, 0, 1
    assert stats["reward/fmt/mean"] == 0.5 and stats["reward/fmt/std"] == 0.0


def test_a_function_that_abstains_everywhere_gives_zeros():
    stats = reward_stats({"judge": [None, None]}, [None, None], [0, 0])
    assert stats["reward/judge/mean"] == 0.0 and stats["reward/judge/std"] == 0.0


def test_frac_reward_zero_std_counts_groups_not_samples():
    # group 0 varies; group 1 all equal; group 2 one valid total (nothing to compare with); group 3 varies
    total = [1.0, 0.0, 0.5, 0.5, 0.5, None, 0.0, 2.0, 1.0]
    groups = [0, 0, 1, 1, 1, 2, 2, 3, 3]
    assert reward_stats({}, total, groups)["frac_reward_zero_std"] == pytest.approx(2 / 4)


def test_groups_of_any_size_and_order():
    assert reward_stats({}, [1.0, 1.0, 3.0, 1.0], [5, 5, 2, 2])["frac_reward_zero_std"] == 0.5


def test_lengths_must_match():
    with pytest.raises(ValueError, match="3 total rewards for 2 group ids"):
        reward_stats({}, [1.0, 0.0, 1.0], [0, 0])
