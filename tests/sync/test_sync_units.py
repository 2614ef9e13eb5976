"""The sync kinds' pieces that need no server: config checks, checkpoint files, adapter payloads, ipc attach."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from tandemrl.config import ConfigError, validate_config
from tandemrl.sync.checkpoint import load_checkpoint_tensors, save_checkpoint
from tandemrl.sync.ipc import attach
from tandemrl.sync.lora import decode_adapter


def small_model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=32, tie_word_embeddings=True))


@pytest.mark.parametrize("raw, words", [
    ({"sync": {"kind": "lora"}}, ["sync.kind = 'lora'", "rollout.backend = 'server'"]),
    ({"rollout": {"backend": "server"}, "sync": {"kind": "checkpoint"}}, ["rollout.server_url"]),
    ({"rollout": {"backend": "server", "server_url": "http://x"}}, ["sync.kind must be one of"]),
    ({"rollout": {"backend": "server", "server_url": "http://x"}, "sync": {"kind": "lora"}}, ["model.lora.enabled"]),
    ({"rollout": {"backend": "server", "server_url": "http://x"}, "sync": {"kind": "nccl"}}, ["nccl_init_method"]),
    ({"rollout": {"backend": "server", "server_url": "http://x"},
      "sync": {"kind": "nccl", "nccl_init_method": "env://"}}, ["sync.nccl_init_method = 'tcp://HOST:PORT'"]),
    ({"rollout": {"backend": "server", "server_url": "http://x"},
      "sync": {"kind": "nccl", "nccl_init_method": "tcp://h:1", "nccl_bucket_mb": 0}}, ["nccl_bucket_mb"]),
    ({"rollout": {"backend": "server", "server_url": "http://x"}, "sync": {"kind": "checkpoint"},
      "model": {"lora": {"enabled": True}}}, ["sync.kind = 'lora'"]),
    ({"sync": {"kind": "shm"}}, ["sync.kind"]),
    ({"rollout": {"max_staleness": -1}}, ["rollout.max_staleness"]),
])
def test_config_errors_name_the_keys(raw, words):
    with pytest.raises(ConfigError) as err:
        validate_config(raw)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_defaults_keep_the_in_process_engine():
    cfg = validate_config({})
    assert cfg.rollout.backend == "engine" and cfg.sync.kind == "inprocess" and cfg.rollout.max_staleness == 0


def test_checkpoint_files(tmp_path):
    model = small_model()
    path = save_checkpoint(model, tmp_path, 3)
    assert path.name == "version-00000003" and not list(tmp_path.glob(".tmp-*"))
    tensors = load_checkpoint_tensors(path)
    assert torch.equal(tensors["model.embed_tokens.weight"], model.model.embed_tokens.weight)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint_tensors(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        load_checkpoint_tensors(tmp_path / "empty")


def test_adapter_payload_errors():
    with pytest.raises(ValueError, match="body is empty"):
        decode_adapter(b"")
    with pytest.raises(ValueError, match="not a complete safetensors payload"):
        decode_adapter(b"\x10\x00\x00\x00\x00\x00\x00\x00{}")


def test_ipc_attach_points_the_parameters_at_the_shared_tensors():
    model, other = small_model(), small_model()
    shared = {n: p.detach().clone() * 2 for n, p in other.named_parameters()}
    attach(model, shared)
    for name, param in model.named_parameters():
        assert param.data_ptr() == shared[name].data_ptr()  # the same memory, not a copy
    assert model.lm_head.weight.data_ptr() == shared["model.embed_tokens.weight"].data_ptr()  # still tied
    with pytest.raises(ValueError, match="missing for 1 parameters"):
        attach(small_model(), {n: t for n, t in list(shared.items())[1:]})
    bad = dict(shared, **{"model.norm.weight": torch.zeros(3)})
    with pytest.raises(ValueError, match="model.norm.weight"):
        attach(small_model(), bad)


def test_nccl_parameter_check_names_the_difference():
    from tandemrl.sync.nccl import check_same_parameters, parameter_specs

    specs = parameter_specs(small_model())
    check_same_parameters(specs, [dict(s) for s in specs])
    other = [dict(s) for s in specs]
    other[1]["shape"] = [1, 2]
    with pytest.raises(ValueError, match=specs[1]["name"]):
        check_same_parameters(specs, other)
    with pytest.raises(ValueError, match="parameters, the server"):
        check_same_parameters(specs, specs[:-1])
