"""A `tandemrl serve` child process for bench/serve.py: started from a model directory, logging to a file (a pipe
nobody reads would fill up and stall the server), read through /metrics, stopped at the end."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tandemrl.models.tokenizer import build_char_tokenizer, save_char_tokenizer

ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 300.0


def save_model_dir(model, directory: Path) -> Path:
    """The model's weights + the project's character tokenizer (the bench sends token ids; text is not read)."""
    model.save_pretrained(str(directory), safe_serialization=True)
    save_char_tokenizer(build_char_tokenizer(model_max_length=model.config.max_position_embeddings), directory)
    return directory


def child_env() -> dict[str, str]:
    """This environment with the repository in front of PYTHONPATH, keeping what is there (carried wheels)."""
    paths = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


class ServerProcess:
    def __init__(self, model_dir: Path, device: str, kv_share: float, lora: bool, log: Path) -> None:
        sets = [f'model.device="{device}"', f"engine.gpu_memory_utilization={kv_share}", "engine.max_num_seqs=256"]
        if device == "cpu":
            sets.append("engine.num_blocks=512")
        if lora:
            sets.append("model.lora.enabled=true")
        command = [sys.executable, "-m", "tandemrl.cli", "serve", str(model_dir), "--port", "0",
                   "--served-model-name", "bench"] + (["--allow-ipc"] if device != "cpu" else [])
        for item in sets:
            command += ["--set", item]
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = log
        with open(log, "w") as sink:
            self.proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, text=True, env=child_env())
        self.url = self._wait_for_url()

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in self.log.read_text(errors="replace").splitlines():
                if line.startswith("serving ") and " on http" in line:
                    return line.split(" on ")[1].split()[0]
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"the server did not start (exit status {self.proc.returncode}); the end of {self.log}:\n"
                           f"{self.log.read_text(errors='replace')[-3000:]}")

    def metric(self, name: str) -> float:
        found = self.metrics()
        if name not in found:
            raise KeyError(f"tandemrl_{name} is not in {self.url}/metrics")
        return found[name]

    def metrics(self) -> dict[str, float]:
        """Every tandemrl_* number of /metrics, by name without the prefix."""
        lines = httpx.get(self.url + "/metrics", timeout=30).text.splitlines()
        pairs = [line.split() for line in lines if line.startswith("tandemrl_")]
        return {name.removeprefix("tandemrl_"): float(value) for name, value in pairs}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
