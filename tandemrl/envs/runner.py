"""One environment: a task's prompts, sampled from a `tandemrl serve` server, scored, pushed to the trainer.

The loop, per group: ask the trainer where it stands (``GET /status``: wait while its queue is full, stop once it
has finished), draw the next prompt of the environment's own pass over the task's train split, sample
``rollout.group_size`` completions from the server at ``rollout.server_url`` (token ids, log-probs and the policy
version that sampled them) — with tools, ``rollout.group_size`` multi-turn trajectories through the agent loop,
each turn a request to the server —, score them with the config's rewards, and push the group (``POST /groups``,
tool output out of the loss). The trainer pushes its weights to the same server after each update (``sync.kind``)
and drops groups that are too stale.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import httpx

from tandemrl.backends.hf_backend import eos_token_ids
from tandemrl.backends.server_backend import ServerBackend
from tandemrl.config import Config
from tandemrl.data.iterator import PromptIterator
from tandemrl.models.load import load_tokenizer, resolve_name_or_path
from tandemrl.rewards.state import RewardTrainerState
from tandemrl.train.agent_setup import run_agent_loop
from tandemrl.train.async_rollouts import ANY_VERSION
from tandemrl.train.group_wire import group_to_json
from tandemrl.train.inputs import RunInputs, run_data, run_reward
from tandemrl.train.rollouts import ScoredRollouts, generate_and_score, prompt_encoder, rollout_params

POLL_S = 0.05


class TrainerGone(ConnectionError):
    """The trainer stopped answering (or never did within the start-up wait)."""


@dataclass
class EnvironmentReport:
    pushed: int = 0  # groups the trainer accepted
    refused: int = 0  # pushes answered "queue full" (pushed again)


def run_environment(cfg: Config, trainer_url: str, name: str = "env", seed: int = 0,
                    stop: threading.Event | None = None, connect_timeout_s: float = 60.0) -> EnvironmentReport:
    """Push groups until the trainer finishes (or ``stop`` is set); what was pushed."""
    stop = stop or threading.Event()
    path = resolve_name_or_path(cfg.model.name_or_path, tiny_dir=cfg.model.tiny_dir, tiny_seed=cfg.model.tiny_seed)
    tokenizer = load_tokenizer(path, trust_remote_code=cfg.model.trust_remote_code)
    r = cfg.rollout
    server = ServerBackend(r.server_url or "", max_staleness=ANY_VERSION, retries=r.server_retries,
                           backoff_s=r.server_backoff_s, timeout_s=r.server_timeout_s)
    agent = run_agent_loop(cfg, server, tokenizer, eos_token_ids(None, tokenizer))  # tools: multi-turn, turn by turn
    encoder = prompt_encoder(cfg, tokenizer, agent)
    reward = run_reward(cfg, RunInputs())
    prompts = PromptIterator(run_data(cfg, RunInputs()).train, 1, seed=seed)
    report = EnvironmentReport()
    try:
        with httpx.Client(base_url=trainer_url.rstrip("/"), timeout=30.0) as trainer:
            _wait_for(trainer, connect_timeout_s, stop)
            while not stop.is_set():
                status = _status(trainer)
                if status is None or status["finished"]:
                    break
                if status["queue_groups"] >= status["capacity_groups"]:
                    time.sleep(POLL_S)  # the trainer has enough; a group sampled now would only age
                    continue
                # the trainer's step is not told to an environment: its policy version (updates applied) stands
                # for it, and the epoch is this environment's own pass over the data
                state = RewardTrainerState(global_step=int(status["trainer_version"]), max_steps=cfg.train.max_steps,
                                           epoch=prompts.progress)
                samples = prompts.next_batch()
                # a group's trajectories send their turns one request each: a shared seed could make them alike
                turn_seed = None if agent is not None else seed * 1_000_003 + prompts.batches_served
                scored = generate_and_score(server, encoder, samples, reward, rollout_params(r, turn_seed),
                                            r.group_size, ANY_VERSION, f"{name}-{prompts.batches_served}",
                                            trainer_state=state, agent=agent)
                if not _push(trainer, scored, name, report, stop):
                    break
    finally:
        if agent is not None:
            agent.close()  # the server turns' connections
    return report


def _wait_for(trainer: httpx.Client, timeout_s: float, stop: threading.Event) -> None:
    deadline = time.monotonic() + timeout_s
    while _status(trainer) is None:
        if time.monotonic() > deadline or stop.is_set():
            raise TrainerGone(f"no trainer answered at {trainer.base_url} within {timeout_s:.0f} s "
                              "(is it running with rollout.env_port?)")
        time.sleep(0.2)


def _status(trainer: httpx.Client) -> dict | None:
    try:
        response = trainer.get("/status")
    except httpx.TransportError:
        return None
    return response.json() if response.status_code == 200 else None


def _push(trainer: httpx.Client, scored: ScoredRollouts, name: str, report: EnvironmentReport,
          stop: threading.Event) -> bool:
    """Push until accepted; False once the trainer is gone or finished."""
    body = group_to_json(scored, name)
    while not stop.is_set():
        try:
            response = trainer.post("/groups", json=body)
        except httpx.TransportError:
            return False
        if response.status_code == 200:
            report.pushed += 1
            return True
        if response.status_code != 503:
            raise ValueError(f"the trainer refused a group: {response.status_code} {response.text[:300]}")
        report.refused += 1
        if response.json().get("finished"):
            return False
    return False
