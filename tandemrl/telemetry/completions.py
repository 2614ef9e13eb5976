"""What the completions look like: the truncated share of a step, and a few of them printed as a table
(TRL's ``log_completions``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rich.table import Table
from rich.text import Text

# finish reasons of a completion cut by its token budget: a single turn's "length", or a multi-turn trajectory that
# ran out of tokens for the next turn
CLIPPED = frozenset({"length", "max_total_tokens"})


def clipped_ratio(finish_reasons: Sequence[str]) -> dict[str, float]:
    """``completions/clipped_ratio``: the fraction of completions that hit the token budget instead of ending."""
    share = sum(reason in CLIPPED for reason in finish_reasons) / len(finish_reasons) if finish_reasons else 0.0
    return {"completions/clipped_ratio": share}


@dataclass
class CompletionExample:
    """One rollout as printed: its prompt, the completion the reward saw, the total reward and its parts."""

    prompt: str
    completion: str
    reward: float | None
    components: Mapping[str, float | None] = field(default_factory=dict)


def shorten(text: str, limit: int, keep_end: bool = False) -> str:
    """At most ``limit`` characters; the cut side marked with an ellipsis. ``keep_end``: keep the tail (a prompt's
    question comes after its template and instructions)."""
    if len(text) <= limit:
        return text
    return "…" + text[len(text) - limit + 1:] if keep_end else text[:limit - 1] + "…"


def completions_table(step: int, examples: Sequence[CompletionExample], prompt_chars: int = 200,
                      completion_chars: int = 1000) -> Table:
    """A rich table of ``examples``: prompt (its end), completion, the total reward (each component below it)."""
    table = Table(title=f"completions at step {step}", show_lines=True, expand=True)
    table.add_column("prompt", ratio=2, overflow="fold")
    table.add_column("completion", ratio=3, overflow="fold")
    table.add_column("reward", justify="right", no_wrap=True)
    for ex in examples:
        reward = "\n".join([_num(ex.reward), *(f"{name} {_num(value)}" for name, value in ex.components.items())])
        # Text, not str: model output like "[/b]" is not rich markup
        table.add_row(Text(shorten(ex.prompt, prompt_chars, keep_end=True)),
                      Text(shorten(ex.completion, completion_chars)), Text(reward))
    return table


def _num(value: float | None) -> str:
    return "none" if value is None else f"{value:.3g}"
