import pytest

from tandemrl.algo import ADVANTAGES, AGGREGATIONS, POLICY_LOSSES, Registry, grpo_loss


def test_register_get_names():
    reg: Registry = Registry("widget")

    @reg.register("b")
    def b():
        return "b"

    @reg.register("a")
    def a():
        return "a"

    assert reg.get("a") is a and reg.get("b") is b
    assert reg.names() == ["a", "b"]
    assert "a" in reg and "c" not in reg


def test_unknown_name_message_and_types():
    reg: Registry = Registry("widget")
    for n in ("c", "a", "b"):
        reg.register(n)(object())
    with pytest.raises(KeyError) as ei:
        reg.get("x")
    assert str(ei.value) == "unknown widget 'x'; valid choices: a, b, c"
    with pytest.raises(ValueError, match="unknown widget 'x'; valid choices: a, b, c"):
        reg.get("x")


def test_duplicate_registration_rejected():
    reg: Registry = Registry("widget")
    reg.register("a")(1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(2)


def test_builtin_registries():
    assert ADVANTAGES.names() == ["dr_grpo", "grpo"]
    assert AGGREGATIONS.names() == ["seq-mean-token-mean", "seq-mean-token-sum-norm", "token-mean"]
    assert POLICY_LOSSES.get("grpo") is grpo_loss
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; valid choices: dr_grpo, grpo"):
        ADVANTAGES.get("ppo")
