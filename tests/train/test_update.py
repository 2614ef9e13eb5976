"""How policy_update combines per-mini-batch metrics over its optimizer steps."""

import pytest

from tandemrl.train.update import _MeanOf


def test_metrics_over_steps_average_shares_and_keep_maxima():
    over_steps = _MeanOf()
    over_steps.add({"kl": 0.25, "mismatch/logp_abs_mean": 0.1, "mismatch/logp_abs_max": 0.5})
    over_steps.add({"kl": 0.75, "mismatch/logp_abs_mean": 0.3, "mismatch/logp_abs_max": 0.25})
    assert over_steps.means() == pytest.approx({"kl": 0.5, "mismatch/logp_abs_mean": 0.2,
                                                "mismatch/logp_abs_max": 0.5})
