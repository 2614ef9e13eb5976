"""The weight routes: GET /v1/weights (the served version and the last push), and one POST per sync kind.

A push that fails (a file that does not load, a truncated body, a missing tensor, a broken broadcast) answers 409
with a message that names the version still served; the server keeps serving it.
"""

from __future__ import annotations

from typing import Any

import torch
from fastapi import FastAPI, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr

from tandemrl.serve.state import BadRequest, ServerState
from tandemrl.sync import checkpoint, ipc, lora, nccl
from tandemrl.sync.checksum import weights_checksum
from tandemrl.sync.receiver import PushRecord, WeightPushError


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CheckpointPush(_Body):
    path: StrictStr
    version: StrictInt


class NcclInit(_Body):
    init_method: StrictStr
    backend: StrictStr = "nccl"
    timeout_s: float = 600.0


class NcclPush(_Body):
    version: StrictInt
    tensors: list[dict[str, Any]]
    bucket_bytes: StrictInt = nccl.DEFAULT_BUCKET_MB * 2**20


class IpcPush(_Body):
    version: StrictInt
    handles: StrictStr | None = None


def add_weight_routes(app: FastAPI, state: ServerState) -> None:
    receiver = state.weights

    @app.get("/v1/weights")
    async def weights_status() -> dict:
        return receiver.status()

    @app.post("/v1/weights/checkpoint")
    async def push_checkpoint(body: CheckpointPush) -> dict:
        return await _apply(lambda: receiver.apply("checkpoint", body.version,
                                                   lambda: checkpoint.load_checkpoint_tensors(body.path), "full"))

    @app.post("/v1/weights/lora")
    async def push_lora(request: Request, version: int = Query(...)) -> dict:
        payload = await request.body()
        return await _apply(lambda: receiver.apply("lora", version, lambda: lora.decode_adapter(payload), "adapter"))

    nccl_groups: list[nccl.SyncGroup] = []  # the trainer's group, once it joined

    def drop_nccl_group() -> None:
        while nccl_groups:
            nccl_groups.pop().close()

    @app.post("/v1/weights/nccl/init")
    async def nccl_init(body: NcclInit) -> dict:
        drop_nccl_group()  # a trainer that starts again joins anew
        nccl_groups.append(await run_in_threadpool(nccl.open_group, body.init_method, 1, body.backend, body.timeout_s))
        # the trainer compares these with its own before the first broadcast (a mismatch would hang it)
        return {"joined": True, "policy_version": state.policy_version,
                "tensors": nccl.parameter_specs(receiver.model)}

    @app.post("/v1/weights/nccl/push")
    async def push_nccl(body: NcclPush) -> dict:
        if not nccl_groups:
            raise BadRequest("no process group: POST /v1/weights/nccl/init first", 409, code="no_process_group")
        if body.bucket_bytes < 2**10:
            raise BadRequest(f"bucket_bytes = {body.bucket_bytes}: at least 1024", 422, param="bucket_bytes")
        group, device = nccl_groups[0], next(receiver.model.parameters()).device
        try:
            return await _apply(lambda: receiver.apply(
                "nccl", body.version, lambda: nccl.receive_parameters(group, body.tensors, body.bucket_bytes, device),
                "full"))
        except BadRequest:
            drop_nccl_group()  # a broken broadcast leaves the group unusable: the trainer joins anew
            raise

    @app.get("/v1/weights/checksum")
    async def served_checksum() -> dict:
        """The served weights' checksum (sync/checksum.py), taken between engine steps."""
        checksum = await run_in_threadpool(lambda: state.loop.between_steps(
            lambda: weights_checksum(nccl.named_weights(receiver.model))).result())
        return {"policy_version": state.policy_version, "checksum": checksum}

    @app.post("/v1/weights/ipc")
    async def push_ipc(body: IpcPush) -> dict:
        if receiver.kind != "ipc":  # the handles are pickles
            raise BadRequest("this server does not accept CUDA IPC handles: start it with --allow-ipc", 403,
                             param="handles", code="ipc_not_allowed")
        if body.handles is None:
            return await _apply(lambda: receiver.set_version("ipc", body.version))
        return await _apply(lambda: receiver.set_version(
            "ipc", body.version, lambda: _attach(state, ipc.open_handles(body.handles))))


def _attach(state: ServerState, shared: dict) -> None:
    """Between steps: the engine drops its KV cache and CUDA graphs (they hold the old addresses), the parameters
    point at the trainer's memory, the engine comes back (running sequences are recomputed)."""
    engine = state.loop.engine
    engine.sleep()
    try:
        ipc.attach(state.weights.model, shared)
    finally:
        engine.wake()


async def _apply(push) -> dict:  # noqa: ANN001 - a callable returning a PushRecord
    try:
        record: PushRecord = await run_in_threadpool(push)
    except WeightPushError as exc:
        raise BadRequest(str(exc), 409, code="weight_push_failed") from None
    return {"policy_version": record.version, "seconds": record.seconds, "bytes": record.bytes}
