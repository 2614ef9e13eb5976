"""`torchrun -m tandemrl train` on the CPU (gloo): a rank dying ends the job, naming the rank, with the last
checkpoint intact; the run then resumes from it with another number of processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tandemrl.models.tiny import ensure_tiny_model
from tandemrl.telemetry.writers import read_metrics
from tandemrl.train.checkpoint import checkpoint_info, checkpoint_problem, find_latest

REPO = Path(__file__).resolve().parents[2]

# Rank 1 exits hard on its 4th reward call: the initial evaluation, steps 1 and 2, then step 3.
DYING_REWARD = '''
import os
CALLS = []
def die_on_rank1(prompts, completions, **columns):
    CALLS.append(1)
    if os.environ.get("RANK") == "1" and len(CALLS) == 4:
        os._exit(17)
    return [0.0] * len(completions)
'''


def torchrun(workdir: Path, processes: int, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",  # a free port, chosen by torchrun
               f"--nproc-per-node={processes}", "-m", "tandemrl", "train", *args]
    return subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)


def test_a_dying_rank_ends_the_job_and_the_run_resumes_with_one_process(tmp_path):
    (tmp_path / "dying_reward.py").write_text(DYING_REWARD)
    tiny = ensure_tiny_model(tmp_path / "tiny")
    settings = [f'model.tiny_dir="{tiny}"', "checkpoint.every_steps=1", "eval.limit=8", "eval.pass_k=0",
                "rollout.prompts_per_step=4", "rollout.group_size=4", "log.tensorboard=false",
                "distributed.timeout_s=60", 'reward.weights={accuracy=1.0, "dying_reward:die_on_rank1"=0.5}']
    overrides = [arg for setting in settings for arg in ("--set", setting)]

    died = torchrun(tmp_path, 2, "--out", "run", "--set", "train.max_steps=5", *overrides)
    output = died.stdout + died.stderr
    assert died.returncode != 0, output[-3000:]
    root_cause = output.split("Root Cause")[-1]
    assert "rank      : 1" in root_cause and "exitcode  : 17" in root_cause, output[-3000:]

    checkpoints = tmp_path / "run" / "checkpoints"
    latest = find_latest(checkpoints)
    assert latest is not None and latest.name == "step-00000002"
    assert checkpoint_problem(latest) is None
    info = checkpoint_info(latest)
    assert info["model_format"] == "fsdp-dcp" and info["world_size"] == 2
    assert not list(checkpoints.glob("step-00000003*"))

    resumed = torchrun(tmp_path, 1, "--out", "run", "--resume", "--set", "train.max_steps=3")
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 3
    steps = [row for row in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in row]
    assert [row["step"] for row in steps] == [1, 2, 3]
    assert all(row["time/weight_gather"] >= 0 for row in steps)
    assert json.loads((find_latest(checkpoints) / "trainer_state.json").read_text())["_checkpoint"]["world_size"] == 1
