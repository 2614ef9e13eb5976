"""Atomic checkpoints and exact resume: round trip, in-place loading, failures mid-save, kill -9."""

from __future__ import annotations

import copy
import errno
import functools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from tandemrl.train import checkpoint as ckpt
from tandemrl.train.checkpoint import (
    CheckpointError,
    checkpoint_info,
    find_latest,
    is_complete_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from tandemrl.train.rng import capture_rng_state, restore_rng_state, seed_everything

REPO = Path(__file__).resolve().parents[2]
TINY = dict(
    vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    intermediate_size=64, tie_word_embeddings=True,
)


def tiny_model(seed: int = 0, **overrides) -> transformers.Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**{**TINY, **overrides}))


def tiny_tokenizer():
    from tandemrl.models.tokenizer import build_char_tokenizer  # the project's own offline tokenizer

    return build_char_tokenizer()


def optim_for(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return opt, sched


def train_step(model, opt, sched) -> None:
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))  # draws from torch's RNG: resume must repeat it
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    sched.step()
    opt.zero_grad()


def save(root, step, model, opt=None, sched=None, state=None, **kw):
    return save_checkpoint(
        root, step, model=model, tokenizer=kw.pop("tokenizer", None), optimizer=opt, scheduler=sched,
        trainer_state={"step": step} if state is None else state, **kw,
    )


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(a, b, where="") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(4)


def dirs(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


# ------------------------------------------------------------------------------------------ round trip


def test_round_trip_resumes_exactly(tmp_path):
    seed_everything(0)
    model = tiny_model(0)
    opt, sched = optim_for(model)
    for _ in range(2):
        train_step(model, opt, sched)
    state = {"step": 2, "policy_version": 2, "data": {"epoch": 0, "order": [3, 1, 2], "cursor": 5},
             "initial_eval": None, "metrics": {"loss": 0.5, "lr": 1e-2}}
    path = save(tmp_path, 2, model, opt, sched, state, tokenizer=tiny_tokenizer())
    assert path == tmp_path / "step-00000002"
    assert (tmp_path / "latest").read_text().strip() == "step-00000002"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "optimizer.pt", "scheduler.pt",
                 "rng.pt", "trainer_state.json", "COMPLETE"):
        assert (path / name).is_file(), name
    saved_opt, saved_sched = copy.deepcopy(opt.state_dict()), copy.deepcopy(sched.state_dict())
    expected_draws = draws()
    for _ in range(2):
        train_step(model, opt, sched)
    expected_weights = weights(model)

    seed_everything(123)  # another process: other weights, fresh optimizer, other RNG streams
    other = tiny_model(7)
    opt2, sched2 = optim_for(other)
    got = load_checkpoint(find_latest(tmp_path), model=other, optimizer=opt2, scheduler=sched2)

    assert got == state
    assert_same(opt2.state_dict(), saved_opt, "optimizer")
    assert sched2.state_dict() == saved_sched
    assert sched2.get_last_lr() == pytest.approx([1e-2 / 3])
    a, b = draws(), expected_draws
    assert a[:2] == b[:2] and torch.equal(a[2], b[2])
    for _ in range(2):
        train_step(other, opt2, sched2)
    assert_same(weights(other), expected_weights, "weights after resumed steps")
    info = checkpoint_info(path)
    assert info["step"] == 2 and info["model_format"] == "full" and info["has_optimizer"]


def test_load_copies_into_the_existing_tensors(tmp_path):
    model = tiny_model(0)
    save(tmp_path, 1, model)
    other = tiny_model(1)
    ptrs = {k: p.data_ptr() for k, p in other.named_parameters()}
    params = dict(other.named_parameters())
    load_checkpoint(tmp_path / "step-00000001", model=other)
    assert {k: p.data_ptr() for k, p in other.named_parameters()} == ptrs
    assert all(p is params[k] for k, p in other.named_parameters())
    assert other.lm_head.weight is other.model.embed_tokens.weight  # still tied
    assert_same(weights(other), weights(model))


def test_saved_folder_loads_with_from_pretrained(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model(0, vocab_size=len(tokenizer))
    path = save(tmp_path, 5, model, tokenizer=tokenizer)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert_same(weights(loaded), weights(model))
    text = "Natalia sold 48/2 = 24 clips.<|im_end|>"
    assert transformers.AutoTokenizer.from_pretrained(path)(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_sharded_weights_load(tmp_path, monkeypatch):
    model = tiny_model(0)
    sharded = functools.partial(type(model).save_pretrained, model, max_shard_size="20KB")
    monkeypatch.setattr(model, "save_pretrained", sharded, raising=False)
    path = save(tmp_path, 1, model)
    assert (path / "model.safetensors.index.json").is_file() and not (path / "model.safetensors").exists()
    other = tiny_model(1)
    load_checkpoint(path, model=other)
    assert_same(weights(other), weights(model))


def test_key_mismatch_names_the_keys(tmp_path):
    save(tmp_path, 1, tiny_model(0, num_hidden_layers=2))
    with pytest.raises(CheckpointError, match=r"unexpected keys.*model\.layers\.1\."):
        load_checkpoint(tmp_path / "step-00000001", model=tiny_model(0))
    save(tmp_path, 2, tiny_model(0))
    with pytest.raises(CheckpointError, match=r"missing keys.*model\.layers\.1\."):
        load_checkpoint(tmp_path / "step-00000002", model=tiny_model(0, num_hidden_layers=2))
    save(tmp_path, 3, tiny_model(0, intermediate_size=48))
    with pytest.raises(CheckpointError, match=r"shape mismatches.*mlp"):
        load_checkpoint(tmp_path / "step-00000003", model=tiny_model(0))


def test_missing_optimizer_file_is_a_clear_error(tmp_path):
    model = tiny_model(0)
    save(tmp_path, 1, model)
    opt, _ = optim_for(model)
    with pytest.raises(CheckpointError, match="no optimizer.pt"):
        load_checkpoint(tmp_path / "step-00000001", model=model, optimizer=opt)


def test_peft_adapter_round_trip_in_place(tmp_path):
    peft = pytest.importorskip("peft")
    config = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], task_type="CAUSAL_LM")
    model = peft.get_peft_model(tiny_model(0), peft.LoraConfig(init_lora_weights=False, **config))
    path = save(tmp_path, 3, model, state={"step": 3})
    assert (path / "adapter_model.safetensors").is_file()
    assert checkpoint_info(path)["model_format"] == "peft_adapter"

    other = peft.get_peft_model(tiny_model(0), peft.LoraConfig(**config))  # lora_B starts at zero
    ptrs = {k: p.data_ptr() for k, p in other.named_parameters()}
    assert load_checkpoint(path, model=other) == {"step": 3}
    assert {k: p.data_ptr() for k, p in other.named_parameters()} == ptrs
    assert_same(weights(other), weights(model))
    with pytest.raises(CheckpointError, match="PEFT adapter"):
        load_checkpoint(path, model=tiny_model(0))


def test_rng_capture_restore_and_seed():
    seed_everything(5)
    first = draws()
    seed_everything(5)
    assert draws()[:2] == first[:2]
    np.random.normal()  # leaves a cached gaussian in numpy's state
    state = capture_rng_state()
    expected = draws() + (float(np.random.normal()),)
    draws()
    restore_rng_state(state)
    got = draws() + (float(np.random.normal()),)
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2]) and got[3] == expected[3]


# ---------------------------------------------------------------------------------------- failures


def _enospc():
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _assert_previous_intact(root: Path, model_at_1) -> None:
    assert (root / "latest").read_text().strip() == "step-00000001"
    assert dirs(root) == ["step-00000001"]  # no temp folder, no half step-2
    assert find_latest(root) == root / "step-00000001"
    other = tiny_model(9)
    assert load_checkpoint(root / "step-00000001", model=other) == {"step": 1}
    assert_same(weights(other), weights(model_at_1))


def test_enospc_in_torch_save_keeps_previous(tmp_path, monkeypatch):
    model = tiny_model(0)
    save(tmp_path, 1, model)
    opt, _ = optim_for(model)

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"\0" * 100)  # the checkpoint's writer (checkpoint.torch_save), a file object
        raise _enospc()

    monkeypatch.setattr(ckpt.torch, "save", full_disk)
    with pytest.raises(CheckpointError) as info:
        save(tmp_path, 2, tiny_model(3), opt)
    message = str(info.value)
    assert "could not write checkpoint step 2 to" in message and "step-00000002" in message
    assert "the disk is full" in message and "No space left on device" in message
    assert message.endswith("the previous checkpoint step-00000001 is intact")
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.ENOSPC
    monkeypatch.undo()
    _assert_previous_intact(tmp_path, model)


def test_enospc_in_save_pretrained_keeps_previous(tmp_path, monkeypatch):
    model = tiny_model(0)
    save(tmp_path, 1, model)
    failing = tiny_model(3)

    def full_disk(folder, **kwargs):
        with open(Path(folder) / "model.safetensors", "wb") as out:
            out.write(b"partial")
        raise _enospc()

    monkeypatch.setattr(failing, "save_pretrained", full_disk, raising=False)
    with pytest.raises(CheckpointError, match="No space left on device; the previous checkpoint step-00000001"):
        save(tmp_path, 2, failing)
    _assert_previous_intact(tmp_path, model)


def test_enospc_inside_torch_save_is_the_disk_full_message_not_unexpected_pos(tmp_path, monkeypatch):
    """Issue 34, path 8: torch's own writer turns a failed write into "unexpected pos N vs M"; the save must say
    the disk is full. The failure is injected where the bytes reach the file, half-way through optimizer.pt."""
    model = tiny_model(0)
    save(tmp_path, 1, model)
    later = tiny_model(3)
    opt, sched = optim_for(later)
    train_step(later, opt, sched)
    real_write_all, calls = ckpt._write_all, []

    def disk_fills_up(fd, data):
        calls.append(len(data))
        if len(calls) == 3:
            os.write(fd, bytes(data)[: len(data) // 2])
            raise _enospc()
        real_write_all(fd, data)

    monkeypatch.setattr(ckpt, "_write_all", disk_fills_up)
    with pytest.raises(CheckpointError) as info:
        save(tmp_path, 2, later, opt, sched)
    message = str(info.value)
    assert "the disk is full: OSError: [Errno 28] No space left on device" in message, message
    assert "unexpected pos" not in message and message.endswith("the previous checkpoint step-00000001 is intact")
    monkeypatch.undo()
    _assert_previous_intact(tmp_path, model)


def test_enospc_in_safetensors_is_the_disk_full_message(tmp_path, monkeypatch):
    from safetensors import SafetensorError

    model = tiny_model(0)
    save(tmp_path, 1, model)
    failing = tiny_model(3)
    text = "Error while serializing: I/O error: No space left on device (os error 28)"
    monkeypatch.setattr(failing, "save_pretrained", lambda *a, **k: (_ for _ in ()).throw(SafetensorError(text)),
                        raising=False)
    with pytest.raises(CheckpointError, match="step-00000002: the disk is full: SafetensorError: Error while"):
        save(tmp_path, 2, failing)
    _assert_previous_intact(tmp_path, model)


def test_torch_save_through_the_writer_is_byte_identical(tmp_path):
    import io

    state = {"x": torch.arange(1000.0), "nested": [1, {"y": torch.ones(3, dtype=torch.int64)}]}
    ckpt.torch_save(state, tmp_path / "a.pt")
    buffer = io.BytesIO()
    torch.save(state, buffer)
    assert (tmp_path / "a.pt").read_bytes() == buffer.getvalue()


def test_failure_when_resaving_a_step_restores_the_old_folder(tmp_path, monkeypatch):
    model = tiny_model(0)
    save(tmp_path, 1, model)
    monkeypatch.setattr(ckpt, "_write_latest", lambda root, name: (_ for _ in ()).throw(_enospc()))
    with pytest.raises(CheckpointError, match="step-00000001 is intact"):
        save(tmp_path, 1, tiny_model(4), state={"step": 1, "retry": True})
    monkeypatch.undo()
    _assert_previous_intact(tmp_path, model)


def test_first_save_failure_says_there_is_no_previous(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt.torch, "save", lambda *a, **k: (_ for _ in ()).throw(_enospc()))
    with pytest.raises(CheckpointError, match="there is no previous checkpoint"):
        save(tmp_path, 1, tiny_model(0))
    assert dirs(tmp_path) == [] and find_latest(tmp_path) is None


def test_unserialisable_trainer_state_fails_before_writing(tmp_path):
    root = tmp_path / "ckpts"
    with pytest.raises(TypeError, match=r"trainer_state\['metrics'\]\['loss'\] is a torch.Tensor"):
        save(root, 1, tiny_model(0), state={"step": 1, "metrics": {"loss": torch.tensor(1.0)}})
    with pytest.raises(TypeError, match="keys must be str"):
        save(root, 1, tiny_model(0), state={"step": 1, "per_sample": {3: 0.5}})
    with pytest.raises(TypeError, match="numpy.int64"):
        save(root, 1, tiny_model(0), state={"step": np.int64(1)})
    assert not root.exists()


# ------------------------------------------------------------------------------- finding and pruning


def test_find_latest_skips_temp_and_incomplete(tmp_path):
    assert find_latest(tmp_path / "nothing-here") is None
    assert find_latest(tmp_path) is None
    model = tiny_model(0)
    save(tmp_path, 1, model, keep_last=None)
    good = save(tmp_path, 2, model, keep_last=None)
    stale = tmp_path / ".tmp-step-00000003-999999"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"x")
    incomplete = tmp_path / "step-00000004"
    incomplete.mkdir()
    (incomplete / "trainer_state.json").write_text('{"step": 4}')
    (tmp_path / "latest").write_text("step-00000004\n")
    truncated = tmp_path / "step-00000005"
    shutil.copytree(good, truncated)
    with open(truncated / "model.safetensors", "r+b") as f:
        f.truncate(50)
    assert not is_complete_checkpoint(incomplete) and not is_complete_checkpoint(truncated)
    assert find_latest(tmp_path) == good
    with pytest.raises(CheckpointError, match="no COMPLETE marker"):
        load_checkpoint(incomplete, model=model)
    with pytest.raises(CheckpointError, match="model.safetensors has 50 bytes"):
        load_checkpoint(truncated, model=model)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "step-00000009", model=model)


def test_find_latest_falls_back_to_a_step_moved_aside(tmp_path):
    """A kill between moving an earlier save of step N aside and renaming the new one into place."""
    model = tiny_model(0)
    save(tmp_path, 1, model, state={"step": 1})
    save(tmp_path, 2, model, state={"step": 2})
    os.replace(tmp_path / "step-00000002", tmp_path / ".old-step-00000002-999999")
    assert find_latest(tmp_path) == tmp_path / ".old-step-00000002-999999"
    assert load_checkpoint(find_latest(tmp_path), model=model) == {"step": 2}
    save(tmp_path, 3, model)  # the leftover goes once a later save succeeds
    assert dirs(tmp_path) == ["step-00000001", "step-00000003"]


def test_reserved_key_and_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="_checkpoint"):
        save(tmp_path, 1, tiny_model(0), state={"_checkpoint": 1})
    with pytest.raises(ValueError, match="step must be"):
        save(tmp_path, -1, tiny_model(0))
    assert list(tmp_path.iterdir()) == []


def test_keep_last_prunes_old_steps_and_crash_leftovers(tmp_path):
    model = tiny_model(0)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f".tmp-step-00000002-{dead.pid}").mkdir()  # a crashed save
    (tmp_path / f".tmp-step-00000002-{os.getppid()}").mkdir()  # a live process's save in progress: kept
    (tmp_path / ".trash-step-00000001-1-abc").mkdir()  # an interrupted delete
    for step in range(1, 6):
        save(tmp_path, step, model, keep_last=2)
    assert dirs(tmp_path) == [f".tmp-step-00000002-{os.getppid()}", "step-00000004", "step-00000005"]
    save(tmp_path, 6, model, keep_last=1)
    assert [d for d in dirs(tmp_path) if d.startswith("step-")] == ["step-00000006"]
    save(tmp_path, 6, model, keep_last=1, state={"step": 6, "again": True})  # re-save of the same step
    assert [d for d in dirs(tmp_path) if not d.startswith(".tmp")] == ["step-00000006"]
    assert load_checkpoint(find_latest(tmp_path), model=model) == {"step": 6, "again": True}
    with pytest.raises(ValueError, match="keep_last"):
        save(tmp_path, 7, model, keep_last=0)


# ------------------------------------------------------------------------------------------- kill -9

# One process pays for importing torch and transformers; each round it forks a saver that resumes from the
# latest checkpoint and saves in a loop (odd steps twice, to cover re-saving a step), then SIGKILLs it after the
# delay the test sends and reports how it ended.
_ZYGOTE = r"""
import json, os, signal, sys, time, traceback
from pathlib import Path
import torch
torch.set_num_threads(1)
import transformers
from tandemrl.train.checkpoint import find_latest, load_checkpoint, save_checkpoint
root = Path(sys.argv[1])
model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**json.loads(sys.argv[2])))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
load_checkpoint(find_latest(root), model=model, optimizer=opt)  # warm up lazy imports before forking
print("ready", flush=True)
for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        try:
            latest = find_latest(root)
            step = load_checkpoint(latest, model=model, optimizer=opt)["step"]
            while True:
                step += 1
                with torch.no_grad():
                    for p in model.parameters():
                        p.fill_(float(step))
                for _ in range(1 + step % 2):
                    save_checkpoint(root, step, model=model, tokenizer=None, optimizer=opt, scheduler=None,
                                    trainer_state={"step": step}, keep_last=2)
        except BaseException:
            traceback.print_exc()
        os._exit(3)
    time.sleep(float(line))
    os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    print("killed" if killed else f"ended {status}", flush=True)
"""


def test_kill_9_at_random_moments_leaves_a_loadable_checkpoint(tmp_path):
    root = tmp_path / "ckpts"
    model = tiny_model(0)
    opt, _ = optim_for(model)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(0.0)
    save_checkpoint(root, 0, model=model, tokenizer=None, optimizer=opt, scheduler=None, trainer_state={"step": 0})

    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "CUDA_VISIBLE_DEVICES": ""}  # the savers are forked: keep CUDA out of the process that forks them
    log = open(tmp_path / "zygote.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", _ZYGOTE, str(root), json.dumps(TINY)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=REPO)
    rng = random.Random(1234)
    steps = [0]
    try:
        assert proc.stdout.readline().strip() == "ready", (tmp_path / "zygote.log").read_text()[-3000:]
        start = time.monotonic()
        # a busy machine saves slower: go on past 4 s (up to 60) until the checkpoints have moved on, and let a
        # saver that was killed before its first save live longer next time (the moments stay random)
        stretch = 1
        while len(steps) < 9 and time.monotonic() - start < (4 if len(steps) >= 5 and steps[-1] >= 3 else 60):
            stretch = stretch + 1 if len(steps) > 1 and steps[-1] == steps[-2] else 1
            proc.stdin.write(f"{rng.uniform(0.02, 0.35) * min(stretch, 8):.3f}\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "killed", (tmp_path / "zygote.log").read_text()[-3000:]
            path = find_latest(root)
            assert path is not None and is_complete_checkpoint(path)
            state = load_checkpoint(path, model=model, optimizer=opt, restore_rng=False)
            assert state["step"] >= steps[-1]
            for p in model.parameters():
                assert torch.all(p == float(state["step"])), f"{path}: weights of another step"
            steps.append(state["step"])
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
        log.close()
    assert len(steps) >= 5 and steps[-1] >= 3, steps


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_round_trip_in_place(tmp_path):
    seed_everything(0)
    model = tiny_model(0).cuda()
    opt, sched = optim_for(model)
    ids = torch.randint(0, TINY["vocab_size"], (2, 8), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    sched.step()
    save(tmp_path, 1, model, opt, sched)
    expected = torch.rand(8, device="cuda"), torch.randint(0, 1000, (8,), device="cuda")
    seed_everything(9)
    other = tiny_model(1).cuda()
    opt2, sched2 = optim_for(other)
    ptrs = {k: p.data_ptr() for k, p in other.named_parameters()}
    load_checkpoint(tmp_path / "step-00000001", model=other, optimizer=opt2, scheduler=sched2)
    assert {k: p.data_ptr() for k, p in other.named_parameters()} == ptrs
    assert all(p.is_cuda for p in other.parameters())
    assert_same(weights(other), weights(model))
    assert_same(opt2.state_dict(), opt.state_dict())
    assert all(t.is_cuda for s in opt2.state.values() for k, t in s.items() if k != "step")
    got = torch.rand(8, device="cuda"), torch.randint(0, 1000, (8,), device="cuda")
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
