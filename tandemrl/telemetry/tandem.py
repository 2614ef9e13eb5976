"""Per-step tandem metrics over the rollouts' writers (True = the trained model wrote the token)."""

from __future__ import annotations

from typing import Sequence


def tandem_metrics(sources: Sequence[Sequence[bool]]) -> dict[str, float]:
    """Batch metrics over per-token source masks (True = hot-written token).

    - hot / frozen token fraction: token-weighted over the whole batch (0.0 both when there are no tokens);
    - switches_per_seq: writer changes between adjacent tokens, averaged over ALL sequences (an empty or
      one-token completion counts as 0 switches); 0.0 for an empty batch;
    - tokens_per_segment: total tokens / total segments, a segment being a maximal run of one writer (so two
      selector segments drawn with the same writer count as one here); an empty completion has no segment.
    """
    tokens = hot = switches = segments = 0
    for seq in sources:
        seq = [bool(s) for s in seq]
        tokens += len(seq)
        hot += sum(seq)
        n_switch = sum(1 for a, b in zip(seq, seq[1:]) if a != b)
        switches += n_switch
        segments += (n_switch + 1) if seq else 0
    return {
        "tandem/hot_token_fraction": hot / tokens if tokens else 0.0,
        "tandem/frozen_token_fraction": (tokens - hot) / tokens if tokens else 0.0,
        "tandem/switches_per_seq": switches / len(sources) if len(sources) else 0.0,
        "tandem/tokens_per_segment": tokens / segments if segments else 0.0,
    }
