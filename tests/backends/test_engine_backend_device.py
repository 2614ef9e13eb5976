"""An engine on a second GPU, driven from a thread that did not build it (the async rollout worker's and the server's
engine thread's case): every thread starts with cuda:0 current, and kernels launch on the current device's stream,
so the engine makes its own GPU current around each step, sleep and wake. Needs two GPUs (the multi-GPU kinds)."""

from __future__ import annotations

import threading

import pytest
import torch

from tandemrl.backends.engine_backend import EngineBackend
from tests.engine.test_model_runner import build
from tests.engine.test_tandem import engine_config, requests

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                reason="an engine on cuda:1 beside cuda:0")


def greedy_reference(model, prompt: list[int], new_tokens: int) -> list[int]:
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, min_new_tokens=new_tokens)
    return out[0, len(prompt):].tolist()


def test_an_engine_on_cuda_1_decodes_from_a_thread_where_cuda_0_is_current():
    model = build(device="cuda:1")
    backend = EngineBackend(model, None, engine_config(cuda_graphs=True))
    reqs = requests(count=4, max_tokens=10)
    result: dict[str, object] = {}

    def worker() -> None:
        assert torch.cuda.current_device() == 0  # a new thread's default, whatever the main thread set
        try:
            result["rollouts"] = backend.generate(reqs)
            backend.sleep()
            backend.wake()
            result["again"] = backend.generate(reqs)
            with torch.no_grad():  # the engine alone, as the server's engine thread steps it
                result["direct"] = backend.engine.generate(reqs)
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            result["error"] = exc

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=300)
    backend.close()
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    for rollouts in (result["rollouts"], result["again"], result["direct"]):
        for req, rollout in zip(reqs, rollouts):  # type: ignore[call-overload]
            assert rollout.completion_ids == greedy_reference(model, req.prompt_ids, 10), req.request_id
