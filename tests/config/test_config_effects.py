"""A key that is set but has no effect is an error naming the key and the switch to set."""

import pytest

from tandemrl.config import Config, ConfigError, config_to_toml, load_config
from tandemrl.config.effects import check_effects, set_keys
from tandemrl.tandem.config import TandemConfig

SERVER = ['rollout.backend="server"', 'rollout.server_url="http://127.0.0.1:8000"']


@pytest.mark.parametrize(("overrides", "key", "fix"), [
    (["tandem.p=0.3"], "tandem.p", "tandem.enabled = true"),
    (["curriculum.alpha=2.0"], "curriculum.alpha", "curriculum.enabled = true"),
    (["tools.max_turns=3"], "tools.max_turns", "tools.names"),
    (["tools.enabled=false", "tools.names=['python']"], "tools.names", "tools.enabled = true"),
    (["model.lora.rank=8"], "model.lora.rank", "model.lora.enabled = true"),
    (["rollout.vllm.gpu_memory_utilization=0.5"], "rollout.vllm.gpu_memory_utilization", "rollout.backend = 'vllm'"),
    (['rollout.backend="vllm"', 'rollout.vllm.weight_transfer="http"'], "rollout.vllm.weight_transfer",
     "rollout.backend = 'vllm' with rollout.vllm.mode = 'server'"),
    (['rollout.server_url="http://127.0.0.1:8000"'], "rollout.server_url", "rollout.backend = 'server'"),
    (["rollout.server_retries=5"], "rollout.server_retries", "rollout.backend = 'server'"),
    ([*SERVER, 'sync.kind="ipc"', 'sync.dir="/tmp/sync"'], "sync.dir", "sync.kind = 'checkpoint'"),
    ([*SERVER, 'sync.kind="checkpoint"', 'sync.nccl_backend="gloo"'], "sync.nccl_backend", "sync.kind = 'nccl'"),
    (['rollout.speculative.draft_model="tiny"'], "rollout.speculative.draft_model",
     "rollout.speculative.method = 'draft'"),
    (['rollout.speculative.method="ngram"', 'rollout.speculative.draft_model="tiny"'],
     "rollout.speculative.draft_model", "rollout.speculative.method = 'draft'"),
    (['rollout.speculative.method="draft"', 'rollout.speculative.draft_model="tiny"', "rollout.speculative.ngram_max=5"],
     "rollout.speculative.ngram_max", "rollout.speculative.method = 'ngram'"),
    (["rollout.speculative.num_tokens=6"], "rollout.speculative.num_tokens", "rollout.speculative.method = 'draft' or"),
    (['rollout.backend="hf"', "engine.block_size=32"], "engine.block_size", "rollout.backend = 'engine'"),
    (["log.samples=false", "log.sample_text_per_step=3"], "log.sample_text_per_step", "log.samples = true"),
    (["log.print_completions_every=0", "log.num_completions_to_print=4"], "log.num_completions_to_print",
     "log.print_completions_every"),
])
def test_a_key_under_a_switch_that_is_off_is_an_error(overrides, key, fix):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    message = str(err.value)
    assert f"{key} is set but has no effect while" in message and f"set {fix}" in message
    assert f"or remove {key}" in message


@pytest.mark.parametrize("overrides", [
    ["tandem.enabled=true", "tandem.p=0.3"],
    ["curriculum.enabled=true", "curriculum.alpha=2.0"],
    ["tools.names=['python']", "tools.max_turns=3"],
    ["model.lora.enabled=true", "model.lora.rank=8"],
    ['rollout.backend="vllm"', "rollout.vllm.gpu_memory_utilization=0.5"],
    [*SERVER, 'sync.kind="checkpoint"', 'sync.dir="/tmp/sync"', "engine.block_size=32", "rollout.server_retries=5"],
    ['rollout.speculative.method="draft"', 'rollout.speculative.draft_model="tiny"', "rollout.speculative.rounds=4"],
    ['rollout.speculative.method="ngram"', "rollout.speculative.ngram_max=5", "rollout.speculative.num_tokens=6"],
    ["log.sample_text_per_step=3", "log.print_completions_every=10", "log.num_completions_to_print=4"],
    ["tandem.enabled=false", "curriculum.enabled=false", "model.lora.enabled=false", "tools.enabled=false"],
    ["tandem.p=0.5", 'rollout.backend="hf"', "engine.block_size=16"],  # the default values: nothing changes
])
def test_the_same_keys_with_their_switch_on_or_at_their_defaults_pass(overrides):
    load_config(None, overrides)


def test_every_silent_key_is_named_at_once():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["tandem.selector='chunk'", "tandem.p=0.3", 'rollout.backend="hf"', "engine.block_size=32"])
    message = str(err.value)
    assert "tandem.selector, tandem.p are set but have no effect while tandem.enabled = false: set tandem.enabled " \
           "= true, or remove them" in message
    assert "engine.block_size is set but has no effect while rollout.backend = 'hf'" in message


def test_a_runs_own_config_toml_loads_again(tmp_path):
    # config.toml writes every key: the ones at their defaults under a switch that is off must not trip it
    for overrides in ([], ["tandem.enabled=true", "tandem.p=0.3", "model.lora.enabled=true"]):
        path = tmp_path / "config.toml"
        path.write_text(config_to_toml(load_config(None, overrides)))
        assert load_config(path) == load_config(None, overrides)


def test_a_task_presets_keys_are_not_the_users():
    assert load_config(None, ["data.task='synthetic:peek'"]).tools.active
    # the preset's tools.* do nothing with tools off, but the user did not set them
    assert not load_config(None, ["data.task='synthetic:peek'", "tools.enabled=false"]).tools.active
    with pytest.raises(ConfigError, match=r"tools.max_turns is set but has no effect while tools.enabled = false"):
        load_config(None, ["data.task='synthetic:peek'", "tools.enabled=false", "tools.max_turns=3"])


def test_python_construction_is_checked_too():
    with pytest.raises(ValueError, match="tandem.p is set but has no effect"):
        Config(tandem=TandemConfig(p=0.3))
    cfg = Config()
    with pytest.raises(ValueError, match="model.lora.rank is set but has no effect"):
        cfg.model = {"lora": {"rank": 4}}  # assignment is validated too


def test_set_keys_walks_sections_and_skips_defaults():
    cfg = load_config(None, ["tandem.enabled=true", "tandem.p=0.5", "tandem.selector='chunk'", "train.lr=0.01",
                             "reward.weights={accuracy=2.0}"])
    assert dict(set_keys(cfg)) == {"tandem.enabled": True, "tandem.selector": "chunk", "train.lr": 0.01,
                                   "reward.weights": {"accuracy": 2.0}}
    check_effects(cfg)  # every switch is on
