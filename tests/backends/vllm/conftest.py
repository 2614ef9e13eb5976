"""Fixtures for the vLLM backend tests (marked `vllm`; run by `make test-vllm` in the vLLM environment).

The model is the project's tiny offline model with head_dim 64 (hidden 128, 2 heads): vLLM's CPU attention takes
head dims 32, 64, 80, 96, ..., and 64 is the size most real models use. One vLLM engine serves the whole session
(a start costs seconds); tests that change the trainer's weights put them back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tandemrl.models.tiny import make_tiny_model

TINY64 = dict(hidden_size=128, num_heads=2, num_kv_heads=1)  # head_dim 64


@pytest.fixture(scope="session")
def tiny64_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("vllm") / "tiny64", **TINY64)


@pytest.fixture(scope="session")
def trainer_model(tiny64_dir: Path):
    return AutoModelForCausalLM.from_pretrained(tiny64_dir, dtype=torch.float32)


@pytest.fixture(scope="session")
def tokenizer(tiny64_dir: Path):
    return AutoTokenizer.from_pretrained(tiny64_dir)


@pytest.fixture(scope="session")
def vllm_backend(trainer_model, tokenizer, tiny64_dir: Path):
    from tandemrl.backends.vllm.backend import VLLMBackend

    backend = VLLMBackend(trainer_model, tokenizer, tiny64_dir, seed=0)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def engine_backend(trainer_model, tokenizer):
    from tandemrl.backends.engine_backend import EngineBackend

    backend = EngineBackend(trainer_model, tokenizer)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def vllm_server(tiny64_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A vLLM OpenAI server on 127.0.0.1 serving the tiny model (server mode's tests), started once: its URL."""
    from tandemrl.backends.vllm.launch import start_server

    with start_server(tiny64_dir, tmp_path_factory.mktemp("vllm-server") / "server.log") as url:
        yield url
