"""The Python API and the CLI over it, on a user's own data: a fresh process, two trainers in one process,
`eval RUN_DIR`, `export`, LoRA checkpoints, prompts over the length limit."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import tandemrl
from tandemrl import Trainer
from tandemrl.cli import main

SMALL = {"train.max_steps": 2, "eval.limit": 6, "eval.pass_k": 0, "rollout.prompts_per_step": 4,
         "rollout.group_size": 2, "checkpoint.every_steps": 0, "log.tensorboard": False}
ROWS = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "weight": a} for a in range(5) for b in range(5)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tandemrl_cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "tandemrl", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_public_names_are_exported_and_documented():
    assert "Trainer" in dir(tandemrl)
    for name in tandemrl.__all__[1:]:
        assert getattr(tandemrl, name).__doc__, name


def test_ten_lines_of_python_in_a_fresh_process(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    script = tmp_path / "train.py"
    script.write_text(f"""
from tandemrl import Trainer

def near_ten(completions, weight, **kwargs):
    return [-abs(10 - len(c)) / 10 + 0 * w for c, w in zip(completions, weight)]

trainer = Trainer(model="tiny", train_dataset="train.jsonl", reward_funcs=[near_ten], config={SMALL!r},
                  out_dir="run")
summary = trainer.train()
print("SUMMARY", summary["metric"], summary["final"]["score"], trainer.evaluate()["num_prompts"])
""")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    metric, score, scored = done.stdout.split("SUMMARY")[1].split()
    assert metric == "accuracy" and 0.0 <= float(score) <= 1.0 and int(scored) == 2  # round(10 % of 25 rows) held out
    config = (tmp_path / "run" / "config.toml").read_text()
    assert "inline:near_ten" in config  # a function of the running script is not re-imported from it


def test_two_trainers_in_one_process_and_in_memory_data(tmp_path, capsys):
    def count_a(completions, **kwargs):
        return [float(c.count("1")) for c in completions]

    first = Trainer(model="tiny", train_dataset=ROWS, reward_funcs=[count_a], config=SMALL, out_dir=tmp_path / "a")
    second = Trainer(model="tiny", train_dataset=ROWS[:12], eval_dataset=ROWS[12:], reward_funcs=["accuracy"],
                     reward_weights=[2.0], config={**SMALL, "eval.metric": "reward"}, out_dir=tmp_path / "b")
    one, two = first.train(), second.train()
    assert one["metric"] == "accuracy" and two["metric"] == "reward"
    assert two["final"]["num_prompts"] == 6 and one["final"]["num_prompts"] == 2
    assert second.config.reward.components() == {"accuracy": 2.0} and first.config.reward.functions != ["accuracy"]
    kept = [json.loads(line) for line in (tmp_path / "b" / "data" / "test.jsonl").read_text().splitlines()]
    assert kept == ROWS[12:]  # the run keeps its in-memory data, so `eval RUN_DIR` finds it
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "b"), "--json"]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["num_prompts"] == 6 and "task dataset" in printed.err


def test_cli_eval_run_dir_uses_the_runs_own_task_and_data(tmp_path, capsys, monkeypatch):
    # train and export in this process (a fresh one costs seconds of imports); eval in a fresh one finds their files
    monkeypatch.chdir(tmp_path)  # the paths below are relative, as a user types them
    write_jsonl(tmp_path / "mine.jsonl", ROWS)
    (tmp_path / "rewards.py").write_text("def short(completions, **kwargs):\n"
                                         "    return [None if len(c) > 2 else 1.0 for c in completions]\n")
    sets = [f"--set={k}={json.dumps(v)}" for k, v in SMALL.items()]
    assert main(["train", "--set", "data.path=mine.jsonl", "--set", 'reward.functions=["rewards.py:short"]',
                 "--set", "model.lora.enabled=true", *sets, "--out", "run"]) == 0
    assert "test set: 2 rows of mine.jsonl held out" in capsys.readouterr().out.replace("\n", " ")
    evaluated = tandemrl_cli("eval", "run", cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "on task dataset" in evaluated.stdout and "over 2 samples of task dataset" in evaluated.stdout
    assert "checkpoint step-00000002" in evaluated.stdout  # the LoRA adapter loaded onto the run's base model
    assert main(["export", "run", "merged"]) == 0
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert not any("lora" in name for name, _ in merged.named_parameters())
    import torch

    from tandemrl.train.eval_run import find_run, load_merged, run_config

    run, checkpoint = find_run(tmp_path / "run")  # what `tandemrl serve run` loads: the same merged weights
    served, _ = load_merged(run_config(run, ['model.tiny_dir="' + str(tmp_path / "runs/tiny-model") + '"']),
                            checkpoint, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(served.state_dict().values(), merged.state_dict().values()))
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "merged")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


def test_a_prompt_over_the_limit_names_its_row_or_is_skipped(tmp_path):
    rows = ROWS + [{"prompt": "9" * 600, "answer": "1", "weight": 0}]
    write_jsonl(tmp_path / "long.jsonl", rows)
    config = {**SMALL, "data.max_prompt_tokens": 64, "data.test_fraction": 0.04}
    with pytest.raises(ValueError, match=r"long\.jsonl, line 26: the prompt has 600 tokens, more than "
                                         r"data\.max_prompt_tokens = 64; .*data\.long_prompts = \"skip\""):
        Trainer(model="tiny", train_dataset=str(tmp_path / "long.jsonl"), config=config,
                out_dir=tmp_path / "r1").train()
    assert not (tmp_path / "r1").exists()  # nothing written for a rejected run
    huge = tmp_path / "huge.jsonl"
    write_jsonl(huge, ROWS + [{"prompt": "x" * 50_000_000, "answer": "1", "weight": 0}])
    with pytest.raises(ValueError, match=r"huge\.jsonl, line 26: the prompt has 50,000,000 characters"):
        Trainer(model="tiny", train_dataset=str(huge), config=config, out_dir=tmp_path / "r2").train()
    summary = Trainer(model="tiny", train_dataset=str(tmp_path / "long.jsonl"),
                      config={**config, "data.long_prompts": "skip"}, out_dir=tmp_path / "r3").train()
    assert summary["steps"] == 2


def test_bad_api_arguments_name_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="reward_weights has 1 values for 2 reward_funcs"):
        Trainer(model="tiny", reward_funcs=["accuracy", "format"], reward_weights=[1.0])
    with pytest.raises(ValueError, match=r"train dataset, row 1: cannot be saved as JSON"):
        Trainer(model="tiny", train_dataset=[{"prompt": "x", "blob": object()}])
    with pytest.raises(ValueError, match="eval.metric = 'nope' is not 'accuracy', 'reward' or a reward function"):
        Trainer(model="tiny", train_dataset=ROWS, config={**SMALL, "eval.metric": "nope"}, out_dir=tmp_path).train()


def correct(completions, answer, **kwargs):
    return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]


def test_reward_weights_in_the_config_are_kept_by_name(tmp_path):
    t = Trainer(model="tiny", reward_funcs=[correct, "format"], config={"reward.weights": {"format": 0.1}},
                out_dir=tmp_path)
    assert t.config.reward.weights == {"format": 0.1}
    assert t.config.reward.components()["format"] == 0.1
    # a callable goes by its __name__ too, and the run records it under its own name
    t = Trainer(model="tiny", reward_funcs=[correct, "format"], config={"reward.weights": {"correct": 2.0}},
                out_dir=tmp_path)
    (recorded,) = [name for name in t.config.reward.functions if name != "format"]
    assert t.config.reward.components() == {recorded: 2.0, "format": 1.0} and recorded.endswith("correct")


def test_reward_weights_that_match_no_function_or_come_twice_are_errors(tmp_path):
    with pytest.raises(ValueError, match=r"reward\.weights names 'accuracy', which is neither in reward\.functions "
                                         r"\(.*correct, format\) nor the short name of one"):
        Trainer(model="tiny", reward_funcs=[correct, "format"], config={"reward.weights": {"accuracy": 1.0}},
                out_dir=tmp_path)
    with pytest.raises(ValueError, match=r"reward weights are given twice"):
        Trainer(model="tiny", reward_funcs=[correct, "format"], reward_weights=[1.0, 0.5],
                config={"reward.weights": {"format": 0.1}}, out_dir=tmp_path)


def test_an_unknown_key_in_the_config_argument_names_it(tmp_path):
    with pytest.raises(ValueError, match=r"^Trainer\(config=\.\.\.\): unknown config key 'train\.learning_rate' "
                                         r"\(TRL's learning_rate is tandemrl's train\.lr\)"):
        Trainer(model="tiny", config={"train.learning_rate": 1e-6}, out_dir=tmp_path)
    path = tmp_path / "run.toml"
    path.write_text("[rollout]\nnum_generations = 8\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: unknown config key 'rollout\.num_generations'"):
        Trainer(model="tiny", config=path, out_dir=tmp_path)


def test_resuming_a_directory_that_holds_no_run_is_an_error(tmp_path):
    trainer = Trainer(model="tiny", config=SMALL, out_dir=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"nowhere holds no run to resume \(no such directory\)"):
        trainer.train(resume=True)
    assert not (tmp_path / "nowhere").exists()
