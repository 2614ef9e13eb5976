import re
import tomllib

import pytest

from tandemrl.config import Config, ConfigError, config_to_toml, load_config, validate_config
from tandemrl.config.loading import set_key


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


def test_unknown_key_in_a_toml_file_names_the_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[rollout]\ngroupsize = 4\n[train]\nmax_steps = 3\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: unknown config key 'rollout\.groupsize' "
                                          r"\(did you mean 'group_size'\?\)"):
        load_config(path)
    path.write_text("trian = {max_steps = 3}\n[model.lora]\nrnak = 8\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["train.max_steps=2"])
    lines = str(err.value).splitlines()  # every unknown key, one line each, under the file's name
    assert lines[0] == f"{path}:" and "unknown config key 'trian'" in lines[1]
    assert "unknown config key 'model.lora.rnak' (did you mean 'rank'?)" in lines[2]


def test_unknown_key_in_a_set_names_the_set():
    with pytest.raises(ConfigError, match=r"^--set 'rollout\.groupsize=4': unknown config key 'rollout\.groupsize'"):
        load_config(None, ["rollout.groupsize=4"])


def test_a_dict_valued_key_is_not_checked_as_a_section(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[reward.weights]\naccuracy = 1.0\n"my.mod:fn" = 0.5\n')
    assert load_config(path).reward.weights == {"accuracy": 1.0, "my.mod:fn": 0.5}


@pytest.mark.parametrize("override, hint", [
    ("train.learning_rate=1e-6", "TRL's learning_rate is tandemrl's train.lr"),
    ("learning_rate=1e-6", "TRL's learning_rate is tandemrl's train.lr"),
    ("rollout.num_generations=8", "TRL's num_generations is tandemrl's rollout.group_size"),
    ("num_generations=8", "TRL's num_generations is tandemrl's rollout.group_size"),
    ("train.per_device_train_batch_size=4", "TRL's per_device_train_batch_size is tandemrl's "
                                            "rollout.prompts_per_step or train.max_tokens_per_micro_batch"),
    ("max_completion_length=256", "TRL's max_completion_length is tandemrl's rollout.max_tokens"),
    ("train.beta=0.04", "TRL's beta is tandemrl's train.kl_beta"),
    ("train.temperature=0.7", "TRL's temperature is tandemrl's rollout.temperature"),
    ("train.min_p=0.1", "TRL's min_p has no tandemrl key"),
])
def test_a_trl_name_is_told_tandemrls_key(override, hint):
    with pytest.raises(ConfigError, match=re.escape(f"({hint}")):
        load_config(None, [override])
    key = override.partition("=")[0]
    raw: dict = {}
    set_key(raw, key, 1, "test")
    with pytest.raises(ConfigError, match=re.escape(f"unknown config key {key!r} ({hint}")):
        validate_config(raw)  # the Python API's dicts take this way


@pytest.mark.parametrize(
    "override, key",
    [
        ("rollout.group_size=1", "rollout.group_size"),
        ("rollout.temperature=-0.5", "rollout.temperature"),
        ("train.max_steps=zero", "train.max_steps"),
        ("model.dtype=float8", "model.dtype"),
        ("train.tis_cap=-1.0", "train.tis_cap"),
    ],
)
def test_impossible_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [override])


def test_tis_cap_defaults_to_off_and_takes_a_cap():
    assert load_config(None, []).train.tis_cap == 0.0
    assert load_config(None, ["train.tis_cap=2.0"]).train.tis_cap == 2.0


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
    assert set(parsed) == {"model", "data", "rollout", "engine", "tandem", "tools", "sync", "reward", "curriculum",
                           "train", "eval", "checkpoint", "distributed", "log"}
    assert parsed["model"]["lora"]["rank"] == 16


@pytest.mark.parametrize("overrides, message", [
    (["rollout.speculative.method=\"draft\""], "rollout.speculative.draft_model"),
    (["rollout.speculative.method=\"ngram\"", "rollout.speculative.num_tokens=0"],
     "rollout.speculative.num_tokens must be an integer >= 1"),
    (["rollout.speculative.method=\"ngram\"", "rollout.backend=\"hf\""], "needs rollout.backend = 'engine'"),
    (["rollout.speculative.method=\"ngram\"", "rollout.top_p=0.9"], "unset rollout.top_p and rollout.top_k"),
    (["rollout.speculative.method=\"medusa\""], "rollout.speculative.method"),
    (["rollout.speculative.draft=\"x\""], "unknown config key 'rollout.speculative.draft'"),
])
def test_speculative_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)


@pytest.mark.parametrize("overrides, message", [
    (["tandem.enabled=true", "tandem.p=1.5"], "tandem.p"),
    (["tandem.enabled=true", "rollout.backend=\"hf\""], "tandem.enabled needs rollout.backend = 'engine'"),
    (["tandem.enabled=true", "tandem.frozen_device=\"cuda:64\""], "tandem.frozen_device = 'cuda:64': this machine has"),
    (["tandem.enabled=true", "tandem.frozen_device=\"tpu\""], "tandem.frozen_device = 'tpu': expected 'cpu'"),
    (["tandem.enabled=true", "tandem.frozen_device=\"cpu:1\""], "tandem.frozen_device = 'cpu:1': expected 'cpu'"),
    (["tandem.enabled=true", "tandem.max_run_tokens=0"], "tandem.max_run_tokens"),
])
def test_tandem_config_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides)


def test_a_frozen_device_this_machine_has_is_accepted():
    assert load_config(None, ["tandem.enabled=true", 'tandem.frozen_device="cpu"']).tandem.frozen_device == "cpu"


def test_the_example_configs_load():
    from pathlib import Path

    examples = sorted(Path(__file__).resolve().parents[2].joinpath("examples").glob("*.toml"))
    assert examples
    for path in examples:
        load_config(path)


def _numeric_keys(section: type, prefix: str = "") -> list[str]:
    """Every key of the config whose type takes an int or a float (dataclass sections included)."""
    import dataclasses
    import types
    import typing

    from pydantic import BaseModel

    if isinstance(section, type) and issubclass(section, BaseModel):
        fields = {name: f.annotation for name, f in section.model_fields.items()}
    else:
        fields = typing.get_type_hints(section)
    keys = []
    for name, annotation in fields.items():
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
        members = typing.get_args(annotation) if union else (annotation,)
        nested = [m for m in members if isinstance(m, type) and (issubclass(m, BaseModel) or dataclasses.is_dataclass(m))]
        if nested:
            keys += _numeric_keys(nested[0], f"{prefix}{name}.")
        elif any(m in (int, float) for m in members):
            keys.append(prefix + name)
    return keys


NUMERIC_KEYS = _numeric_keys(Config)


def test_the_walk_finds_the_numeric_keys_of_every_section():
    for key in ("train.lr", "train.max_steps", "engine.block_size", "tandem.p",
                "rollout.speculative.num_tokens", "rollout.vllm.timeout_s", "curriculum.bandwidth", "tools.max_turns"):
        assert key in NUMERIC_KEYS
    assert len(NUMERIC_KEYS) > 60, NUMERIC_KEYS


@pytest.mark.parametrize("key", NUMERIC_KEYS)
def test_every_numeric_key_refuses_a_boolean_and_names_the_key(key):
    """`--set train.lr=true` used to train at lr 1.0 (issue 34)."""
    with pytest.raises(ConfigError, match=re.escape(key) + r".*boolean"):
        load_config(None, [f"{key}=true"])


@pytest.mark.parametrize("override, key, words", [
    ('train.lr="0.5"', "train.lr", "string"),
    ('train.max_steps="5"', "train.max_steps", "string"),
    ('engine.block_size="16"', "engine.block_size", "string"),
    ("train.lr=inf", "train.lr", "finite"),
    ("curriculum.unseen_reward=nan", "curriculum.unseen_reward", "finite"),
    ("tandem.frozen_token_weight=inf", "tandem.frozen_token_weight", "finite"),
    ("train.adam_betas=[true, 0.9]", "train.adam_betas.0", "boolean"),
    ("train.adam_betas=[0.9, nan]", "train.adam_betas.1", "finite"),
    ("reward.weights={accuracy=true}", "reward.weights.accuracy", "boolean"),
    ("reward.weights={accuracy=-inf}", "reward.weights.accuracy", "finite"),
])
def test_numbers_refuse_strings_non_finite_values_and_booleans_inside_lists(override, key, words):
    with pytest.raises(ConfigError, match=re.escape(key) + ".*" + words):
        load_config(None, [override])


def test_numbers_that_stay_valid_after_the_strict_check():
    cfg = load_config(None, ["train.lr=1", "engine.block_size=16.0", "tandem.enabled=true", "tandem.p=1",
                             "train.adam_betas=[1, 0.5]", "curriculum.enabled=true", 'curriculum.bandwidth="silverman"',
                             "model.lora.enabled=true", "train.max_minutes=2"])
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float) and cfg.engine.block_size == 16
    assert cfg.train.adam_betas == (1.0, 0.5) and cfg.curriculum.bandwidth == "silverman"
    assert load_config(None, ["curriculum.enabled=true", "curriculum.bandwidth=0.3"]).curriculum.bandwidth == 0.3
    again = Config.model_validate(cfg.model_dump())  # the resolved config (config.toml) validates again
    assert again == cfg
    with pytest.raises(ValueError, match=r"lr[\s\S]*boolean"):
        cfg.train.lr = True  # assignment is validated too


def test_reward_weights_take_the_short_name_the_metrics_show():
    cfg = load_config(None, ['reward.functions=["rewards.py:correct", "format"]', "reward.weights={correct = 2.0}"])
    assert cfg.reward.components() == {"rewards.py:correct": 2.0, "format": 1.0}
    full = load_config(None, ['reward.functions=["rewards.py:correct"]', 'reward.weights={"rewards.py:correct" = 3}'])
    assert full.reward.components() == {"rewards.py:correct": 3.0}


def test_reward_weights_errors_name_the_functions():
    shared = 'reward.functions=["a.py:score", "b.py:score"]'
    with pytest.raises(ConfigError, match=r"reward.weights names 'score', which is the name of more than one reward "
                                          r"function: 'a.py:score' and 'b.py:score'; use the full name"):
        load_config(None, [shared, "reward.weights={score = 2.0}"])
    assert load_config(None, [shared, 'reward.weights={"b.py:score" = 2.0}']).reward.components() == {
        "a.py:score": 1.0, "b.py:score": 2.0}
    with pytest.raises(ConfigError, match=r"reward.weights gives 'rewards.py:correct' two weights \('correct' and "
                                          r"'rewards.py:correct'\)"):
        load_config(None, ['reward.functions=["rewards.py:correct"]',
                           'reward.weights={correct = 2.0, "rewards.py:correct" = 1.0}'])
    with pytest.raises(ConfigError, match=r"reward.weights names 'corect', which is neither in reward.functions "
                                          r"\(rewards.py:correct\) nor the short name of one"):
        load_config(None, ['reward.functions=["rewards.py:correct"]', "reward.weights={corect = 2.0}"])


def test_several_files_merge_section_by_section_and_values_whole(tmp_path):
    from tandemrl.config.loading import merge_sections, read_toml

    first, second = tmp_path / "first.toml", tmp_path / "second.toml"
    first.write_text('[train]\nmax_steps = 5\n[rollout]\ngroup_size = 4\ntemperature = 0.7\n'
                     '[reward.weights]\naccuracy = 1.0\nformat = 0.5\n')
    second.write_text('[rollout]\ngroup_size = 6\n[reward.weights]\naccuracy = 2.0\n')
    cfg = load_config([first, second], ["rollout.temperature=0.9"])
    assert (cfg.rollout.group_size, cfg.rollout.temperature) == (6, 0.9)  # later file, then --set, win
    assert cfg.train.max_steps == 5  # a key only the first file names stays
    assert cfg.reward.weights == {"accuracy": 2.0}  # a table-valued key is a value: replaced, not merged
    assert load_config([first]) == load_config(first)  # one file: the same as before
    table = read_toml(first)
    merged: dict = {}
    merge_sections(merged, table)
    merge_sections(merged, read_toml(second))
    assert table == read_toml(first)  # the first file's tables were copied, not written into


def test_a_missing_second_file_is_named(tmp_path):
    (tmp_path / "a.toml").write_text("[train]\nmax_steps = 3\n")
    with pytest.raises(ConfigError, match=re.escape(f"config file not found: {tmp_path / 'b.toml'}")):
        load_config([tmp_path / "a.toml", tmp_path / "b.toml"])
