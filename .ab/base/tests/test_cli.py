"""The command line: exit codes, one-line errors, JSON output, plots."""

import json

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
