import tomllib

import pytest

from tandemrl.config import Config, ConfigError, config_to_toml, load_config, validate_config


def test_defaults_validate_and_round_trip_through_toml(tmp_path):
    cfg = load_config(None, ["train.max_steps=7", 'reward.weights={accuracy = 1.0, "my.mod:fn" = 0.5}'])
    path = tmp_path / "config.toml"
    path.write_text(config_to_toml(cfg))
    again = load_config(path)
    assert again == cfg
    assert again.train.max_steps == 7
    assert again.reward.weights == {"accuracy": 1.0, "my.mod:fn": 0.5}


def test_overrides_parse_toml_literals_and_bare_strings():
    cfg = load_config(None, ["train.lr=1e-4", "model.gradient_checkpointing=true", "data.task=gsm8k",
                             'rollout.stop=["\\n", "###"]'])
    assert cfg.train.lr == 1e-4
    assert cfg.model.gradient_checkpointing is True
    assert cfg.data.task == "gsm8k"
    assert cfg.rollout.stop == ["\n", "###"]


def test_unknown_key_names_the_key_and_suggests(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout\.groupsize.*did you mean 'group_size'"):
        load_config(None, ["rollout.groupsize=4"])
    with pytest.raises(ConfigError, match="unknown config key 'trian'"):
        validate_config({"trian": {"max_steps": 3}})


@pytest.mark.parametrize(
    "override, key",
    [
        ("rollout.group_size=1", "rollout.group_size"),
        ("rollout.temperature=-0.5", "rollout.temperature"),
        ("train.max_steps=zero", "train.max_steps"),
        ("model.dtype=float8", "model.dtype"),
    ],
)
def test_impossible_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_dtype_error_lists_valid_choices():
    with pytest.raises(ConfigError, match="'auto', 'float32', 'bfloat16' or 'float16'"):
        load_config(None, ["model.dtype=float8"])


def test_registered_algorithm_names_are_checked():
    with pytest.raises(ConfigError, match="train.aggregation = 'mean'.*valid choices: .*token-mean"):
        load_config(None, ["train.aggregation=mean"])
    with pytest.raises(ConfigError, match="train.advantage.*dr_grpo"):
        load_config(None, ["train.advantage=ppo"])


def test_mini_batches_must_divide_the_batch():
    with pytest.raises(ConfigError, match="train.mini_batches=3"):
        load_config(None, ["train.mini_batches=3"])


def test_bad_files_and_bad_set_syntax(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\nmax_steps = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["train.max_steps"])


def test_resolved_toml_is_parseable_and_complete():
    text = config_to_toml(Config())
    parsed = tomllib.loads(text)
    assert set(parsed) == {"model", "data", "rollout", "engine", "reward", "train", "eval", "checkpoint", "log"}
    assert parsed["model"]["lora"]["rank"] == 16
