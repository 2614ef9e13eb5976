import io

from rich.console import Console

from tandemrl.telemetry.completions import CompletionExample, clipped_ratio, completions_table, shorten


def test_clipped_ratio_counts_completions_cut_by_the_budget():
    reasons = ["stop", "length", "length", "max_total_tokens", "max_turns", "error", "stop", "stop"]
    assert clipped_ratio(reasons) == {"completions/clipped_ratio": 3 / 8}
    assert clipped_ratio([]) == {"completions/clipped_ratio": 0.0}


def test_shorten_marks_the_cut_side():
    assert shorten("abcdef", 10) == "abcdef"
    assert shorten("abcdef", 4) == "abc…"
    assert shorten("abcdef", 4, keep_end=True) == "…def"


def test_table_shows_prompt_end_completion_and_reward_parts():
    out = io.StringIO()
    example = CompletionExample("x" * 300 + " What is 2+2?", "[red]4[/red]", 1.5, {"acc": 1.0, "fmt": None})
    Console(file=out, width=160).print(completions_table(7, [example], prompt_chars=40))
    text = out.getvalue()
    assert "completions at step 7" in text and "What is 2+2?" in text and "x" * 41 not in text
    assert "[red]4[/red]" in text and "1.5" in text and "acc 1" in text and "fmt none" in text
