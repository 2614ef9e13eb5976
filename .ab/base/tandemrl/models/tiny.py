"""The project's offline tiny model: a small Qwen2ForCausalLM with the character tokenizer, built from a seed.

`make_tiny_model(dir)` writes a standard Hugging Face model directory (config.json, generation_config.json,
model.safetensors, tokenizer.json, tokenizer_config.json, chat_template.jinja) that AutoModelForCausalLM,
AutoTokenizer and vLLM load like any hub checkpoint. The same seed and sizes give byte-identical files (for one
installed transformers version, which config.json records). Nothing is downloaded.

Sizes: hidden 64, 2 layers, 2 attention heads of head_dim 32 (vLLM's CPU attention supports head dims
32/64/80/...), 1 KV head, MLP 128, tied embeddings, float32 weights. The vocabulary is exactly the tokenizer's
100 tokens (not rounded up): with padding rows a randomly initialised model could sample ids no tokenizer maps.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from tandemrl.models.tokenizer import EOS_TOKEN, IM_END, build_char_tokenizer, save_char_tokenizer

ROPE_THETA = 10000.0


def tiny_config(
    *,
    vocab_size: int,
    eos_id: int,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
) -> Qwen2Config:
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} must be divisible by num_heads {num_heads}")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} must be divisible by num_kv_heads {num_kv_heads}")
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        max_window_layers=num_layers,
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        dtype="float32",
    )


def make_tiny_model(
    out_dir: Path,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    *,
    overwrite: bool = False,
) -> Path:
    """Build the tiny model into `out_dir` and return it (resolved).

    The directory appears whole or not at all: everything is written to a temporary directory beside `out_dir`
    and renamed into place. An existing non-empty `out_dir` is an error unless `overwrite=True`. The global torch
    RNG is left as it was.
    """
    out_dir = Path(out_dir).expanduser().resolve()
    if out_dir.exists() and not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not overwrite:
        raise FileExistsError(f"{out_dir} exists and is not empty; pass overwrite=True to replace it")

    tokenizer = build_char_tokenizer(model_max_length=max_position_embeddings)
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
    config = tiny_config(
        vocab_size=len(tokenizer),
        eos_id=eos_id,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device("cpu"):
            model = Qwen2ForCausalLM(config).to(torch.float32)
    model.eval()
    # Stop on <|im_end|> too, as Qwen's instruct checkpoints do, so chat-formatted generation ends.
    model.generation_config = GenerationConfig(
        bos_token_id=eos_id, eos_token_id=[eos_id, im_end_id], pad_token_id=eos_id
    )

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        model.save_pretrained(str(tmp), safe_serialization=True)
        save_char_tokenizer(tokenizer, tmp)
        _add_compat_keys(tmp / "config.json")
        # No README/model card or other extra files: keep the layout fixed and the bytes reproducible.
        _install(tmp, out_dir, overwrite=overwrite)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def ensure_tiny_model(out_dir: Path, seed: int = 0) -> Path:
    """Return `out_dir`, building the tiny model there first if it holds no model (safe if two processes race)."""
    out_dir = Path(out_dir).expanduser().resolve()
    if (out_dir / "config.json").is_file():
        return out_dir
    try:
        return make_tiny_model(out_dir, seed=seed)
    except FileExistsError:
        if (out_dir / "config.json").is_file():  # another process finished first
            return out_dir
        raise


def _add_compat_keys(config_path: Path) -> None:
    """Spell the settings that transformers 5 renamed the old way too, so 4.x readers (vLLM) see the same model."""
    config = json.loads(config_path.read_text())
    config.setdefault("rope_theta", config.get("rope_parameters", {}).get("rope_theta", ROPE_THETA))
    config.setdefault("torch_dtype", config.get("dtype", "float32"))
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _install(tmp: Path, out_dir: Path, *, overwrite: bool) -> None:
    for path in tmp.iterdir():  # mkdtemp makes 0o700; give the files and the directory the usual modes
        path.chmod(0o644)
    tmp.chmod(0o755)
    if out_dir.is_dir() and not any(out_dir.iterdir()):
        out_dir.rmdir()
    if not out_dir.exists():
        try:
            os.rename(tmp, out_dir)
            return
        except OSError as exc:  # someone created it meanwhile
            raise FileExistsError(f"{out_dir} appeared while the tiny model was being built") from exc
    if not overwrite:
        raise FileExistsError(f"{out_dir} exists and is not empty; pass overwrite=True to replace it")
    old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
    os.rename(out_dir, old / "model")
    try:
        os.rename(tmp, out_dir)
    except OSError:
        os.rename(old / "model", out_dir)  # put the old model back
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
