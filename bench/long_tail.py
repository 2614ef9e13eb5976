"""Long-tailed completion lengths from a random-weight model, and their measured distribution.

A random model's next-token distribution is close to uniform over its vocabulary, so naming K = vocab / mean ids as
end-of-sequence tokens (generation_config.eos_token_id may be a list; the engine stops on any of them) stops each
completion after a token with probability ~1 / mean: geometric lengths, cut at rollout.max_tokens. The ids are the
tokenizer's EOS (0 for the project's character tokenizer) and the last ids of the vocabulary, which that tokenizer does
not have (they decode to nothing), so the rewards read the same text as before. The lengths are then read back from
the run's samples.jsonl: the tail is measured, not assumed.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tandemrl.models.tokenizer import VOCAB_SIZE


def stop_ids(vocab: int, mean_tokens: int, tokenizer_eos: int = 0) -> list[int]:
    """round(vocab / mean_tokens) ids: the tokenizer's EOS and the top of the vocabulary (ids no character has)."""
    count = round(vocab / mean_tokens)
    if not 1 <= count <= vocab - VOCAB_SIZE + 1:
        raise ValueError(f"--mean-tokens {mean_tokens} needs {count} stop ids; the vocabulary ({vocab}) has "
                         f"{vocab - VOCAB_SIZE} beyond the tokenizer's {VOCAB_SIZE}")
    return [tokenizer_eos] + list(range(vocab - count + 1, vocab))


def length_stats(samples: Path, after_step: int) -> dict[str, float]:
    """Completion lengths (tokens) of the steps after ``after_step`` in a run's samples.jsonl: mean, p50, p99, max,
    min, and the share cut at the cap (finish reason "length")."""
    rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["step"] > after_step]
    if not rows:
        return {}
    lengths = sorted(r["tokens"] for r in rows)
    centiles = statistics.quantiles(lengths, n=100, method="inclusive") if len(lengths) > 1 else lengths * 99
    return {"samples": len(lengths), "mean": statistics.mean(lengths), "p50": statistics.median(lengths),
            "p99": centiles[98], "max": lengths[-1], "min": lengths[0],
            "cut_at_cap": sum(r["finish_reason"] == "length" for r in rows) / len(rows)}
