"""The command line: exit codes, one-line errors, JSON output, plots."""

import json

import pytest

from tandemrl.cli import main


def test_config_typo_is_one_clear_line_and_exit_2(tmp_path, capsys):
    code = main(["train", "--out", str(tmp_path / "run"), "--set", "rollout.groupsize=3"])
    err = capsys.readouterr().err
    assert code == 2
    assert "rollout.groupsize" in err and "group_size" in err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing started


def test_resume_without_out_is_refused(capsys):
    assert main(["train", "--resume"]) == 2
    assert "--resume needs --out" in capsys.readouterr().err


def test_eval_json_prints_one_object(tmp_path, capsys):
    code = main(["eval", "--json", "--set", f'model.tiny_dir="{tmp_path / "tiny"}"', "--set", "eval.limit=6",
                 "--set", "eval.pass_k=2", "--set", "model.device=cpu"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    result = json.loads(out[-1])
    assert result["num_prompts"] == 6 and 0.0 <= result["accuracy"] <= 1.0 and result["k"] == 2


def test_eval_of_a_directory_without_config_json(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["eval", "--model", str(tmp_path / "empty")]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_train_then_plot(tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", "--out", str(run), "--set", f'model.tiny_dir="{tmp_path / "tiny"}"',
                 "--set", "model.device=cpu", "--set", "train.max_steps=2", "--set", "eval.limit=4",
                 "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=2"])
    assert code == 0
    assert main(["plot", str(run)]) == 0
    pngs = sorted(p.name for p in (run / "plots").glob("*.png"))
    assert "reward.png" in pngs and "accuracy.png" in pngs
    assert all((run / "plots" / p).stat().st_size > 1000 for p in pngs)


def test_plot_of_a_missing_run_is_a_clear_error(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "nowhere")]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def test_version_prints_and_exits_0(capsys):
    import tandemrl

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code in (0, None)
    assert capsys.readouterr().out.strip() == f"tandemrl {tandemrl.__version__}"


def test_config_prints_resolved_toml_with_overrides(tmp_path, capsys):
    import tomllib

    from tandemrl.config import load_config

    path = tmp_path / "c.toml"
    path.write_text("[rollout]\ngroup_size = 4\n")
    assert main(["config", "--config", str(path), "--set", "train.max_steps=7"]) == 0
    out = capsys.readouterr().out
    printed = tomllib.loads(out)
    assert printed["rollout"]["group_size"] == 4 and printed["train"]["max_steps"] == 7
    assert "model" in printed  # defaults are included, not only what was set
    (tmp_path / "printed.toml").write_text(out)  # what prints loads back to the same config
    assert load_config(tmp_path / "printed.toml") == load_config(path, ["train.max_steps=7"])


def test_config_with_a_bad_key_is_one_line_and_nonzero(capsys):
    assert main(["config", "--set", "rollout.groupsize=3"]) == 2
    err = capsys.readouterr().err
    assert "rollout.groupsize" in err and "Traceback" not in err


def _fake_checkpoint(root, step, complete=True):
    folder = root / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if complete:
        (folder / "COMPLETE").write_text(json.dumps({"format": 1, "step": step, "files": {"config.json": 2}}))
    return folder


def test_eval_run_directory_resolves_to_latest_complete_checkpoint(tmp_path):
    from tandemrl.train.eval_run import find_run

    run = tmp_path / "run"
    _fake_checkpoint(run / "checkpoints", 2)
    newest_complete = _fake_checkpoint(run / "checkpoints", 4)
    _fake_checkpoint(run / "checkpoints", 6, complete=False)  # a save cut short is skipped
    assert find_run(run) is None  # no config.toml: not a run directory
    (run / "config.toml").write_text("")
    assert find_run(run) == (run, newest_complete)
    assert find_run(newest_complete) == (run, newest_complete)  # a checkpoint inside a run: that checkpoint
    assert find_run(tmp_path) is None


def test_eval_of_a_run_directory_without_checkpoint_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "config.toml").write_text("")
    assert main(["eval", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "no complete checkpoint" in err and str(tmp_path / "run") in err


def test_eval_names_the_model_it_scores(tmp_path, capsys):
    code = main(["eval", "--set", f'model.tiny_dir="{tmp_path / "tiny"}"', "--set", "eval.limit=2",
                 "--set", "model.device=cpu"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == f"scoring model tiny ({tmp_path / 'tiny'}) on task synthetic:add"


def test_several_configs_merge_in_order_then_set(tmp_path, capsys):
    """A second --config used to replace the first silently; now a later file overrides only the keys it names."""
    import tomllib

    (tmp_path / "a.toml").write_text("[rollout]\ngroup_size = 4\nprompts_per_step = 3\n[train]\nmax_steps = 5\n")
    (tmp_path / "b.toml").write_text("[rollout]\ngroup_size = 6\n")
    assert main(["config", "--config", str(tmp_path / "a.toml"), "--config", str(tmp_path / "b.toml"),
                 "--set", "train.max_steps=7"]) == 0
    printed = tomllib.loads(capsys.readouterr().out)
    assert printed["rollout"]["group_size"] == 6 and printed["rollout"]["prompts_per_step"] == 3
    assert printed["train"]["max_steps"] == 7


def test_an_unknown_key_in_a_second_config_names_that_file(tmp_path, capsys):
    (tmp_path / "a.toml").write_text("[rollout]\ngroup_size = 4\n")
    (tmp_path / "b.toml").write_text("[rollout]\ngroupsize = 6\n")
    assert main(["config", "--config", str(tmp_path / "a.toml"), "--config", str(tmp_path / "b.toml")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'b.toml'}: unknown config key 'rollout.groupsize'" in err, err


def test_bare_tandemrl_prints_the_help(capsys):
    assert main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tandemrl") and "make-tiny-model" in err and "required" not in err


@pytest.mark.parametrize("command, words", [
    ("plot", ["a run directory"]),
    ("make-tiny-model", ["the model directory to write", "seed of the random weights", "replace DIR"]),
    ("train", ["repeatable: files merge in order"]),
])
def test_every_argument_has_help(capsys, command, words):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())  # argparse wraps to the terminal's width
    assert all(word in out for word in words), out
