"""Tensor-parallel engine on the CPU (gloo, float32): 2 ranks decode the tokens of 1, greedily, token for token, for
the tiny model (1 KV head: replicated on both ranks) and Qwen2.5-0.5B's shapes (2 KV heads split, biased q/k/v,
tied and padded vocabulary); each rank holds about half the weights; sleep frees each rank's KV shard. Tandem,
speculative decoding and seeded sampling agree too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandemrl.engine.config import EngineConfig
from tandemrl.models.tensor_parallel import shard_sizes
from tandemrl.models.tiny import ensure_tiny_model


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tp")
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(Path(__file__).parents[1]))  # the spawned ranks import tests_support
        from tests_support.tp_engine_worker import run_rank
        from tests_support.spawn import spawn_ranks

        tiny = ensure_tiny_model(root / "tiny")
        spawn_ranks(run_rank, (2, str(root / "store"), str(tiny), str(root / "result.json")), 2, root / "store")
    return json.loads((root / "result.json").read_text())


@pytest.mark.parametrize("name", ["tiny", "qwen2.5-0.5b"])
def test_two_ranks_decode_the_tokens_of_one(two_ranks, name):
    result = two_ranks[name]
    assert all(len(tokens) == 12 for tokens in result["reference"])
    assert result["tp"] == result["reference"]
    assert result["after_wake"] == result["reference"][:2]
    assert result["sleep_freed"]


@pytest.mark.parametrize("case", ["tandem", "draft", "sampled"])
def test_tandem_speculative_and_sampled_decoding_over_two_ranks(two_ranks, case):
    """Tandem with the frozen model split, speculative decoding with the draft whole on each rank, seeded sampling:
    the ranks of the group agree, and match one rank (tokens, and tandem's writers)."""
    result = two_ranks["partners"][case]
    assert result["ranks_agree"]
    assert result["tp"] == result["reference"]
    if case == "tandem":
        writers = [w for _, sources in result["tp"] for w in sources]
        assert any(writers) and not all(writers)


def test_each_rank_holds_its_share(two_ranks):
    tiny, qwen = two_ranks["tiny"], two_ranks["qwen2.5-0.5b"]
    assert tiny["local_kv_heads"] == 1 and qwen["local_kv_heads"] == 1
    # the embedding (tied), attention and MLP split; norms and RoPE whole
    assert qwen["shard_params"] < 0.52 * qwen["full_params"]


def test_shapes_that_do_not_split_are_refused_naming_the_key():
    from transformers import Qwen2Config

    config = Qwen2Config(num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, hidden_size=896)
    assert shard_sizes(config, 2).heads == 7
    with pytest.raises(ValueError, match="engine.tensor_parallel_size = 4 must divide the model's attention heads"):
        shard_sizes(config, 4)
    config = Qwen2Config(num_attention_heads=12, num_key_value_heads=3, intermediate_size=96, hidden_size=96)
    with pytest.raises(ValueError, match="engine.tensor_parallel_size = 2 must divide the model's 3 KV heads"):
        shard_sizes(config, 2)
    with pytest.raises(ValueError, match="EngineConfig.tensor_parallel_size must be an integer >= 1"):
        EngineConfig(tensor_parallel_size=0).validate()
