"""ChoiceText: streamed deltas add up to the final text and never run past a stop string or split a character."""

from __future__ import annotations

from tandemrl.serve.stream_text import ChoiceText

# token id -> bytes; 9 and 10 are the two halves of "é"
PIECES = {1: b"ab", 2: b"c", 3: b"d", 4: b"END", 9: b"\xc3", 10: b"\xa9", 5: b"x"}


def decode(ids) -> str:
    return b"".join(PIECES[i] for i in ids).decode("utf-8", errors="replace")


def test_deltas_add_up_and_half_characters_wait():
    text = ChoiceText(decode, ())
    sent = [text.add([1], [-0.1]), text.add([9], [-0.2]), text.add([10, 2], [-0.3, -0.4])]
    assert [s[0] for s in sent] == ["ab", "", "éc"]  # the half of "é" waited for its second byte
    assert [s[1] for s in sent] == [[1], [], [9, 10, 2]]
    assert text.finish([1, 9, 10, 2], [-0.1, -0.2, -0.3, -0.4], "abéc") == ("", [], [])


def test_a_stop_string_is_never_streamed():
    text = ChoiceText(decode, ("cdE",))
    out = [text.add([1], [0.0]), text.add([2], [0.0]), text.add([3], [0.0]), text.add([4], [0.0])]
    streamed = "".join(o[0] for o in out)
    assert "cd" not in streamed  # held back: it could begin the stop string
    final_text, final_ids, _ = text.finish([1, 2, 3], [0.0] * 3, "ab")  # the engine cut at the stop string
    assert streamed + final_text == "ab"
    assert sum((o[1] for o in out), []) + final_ids == [1, 2, 3]  # every id of the rollout, once


def test_long_completions_decode_a_few_tokens_per_new_token():
    calls = []

    def counting(ids) -> str:
        calls.append(len(ids))
        return decode(ids)

    text = ChoiceText(counting, ())
    streamed = "".join(text.add([1 + i % 3], [0.0])[0] for i in range(300))
    assert streamed == decode([1 + i % 3 for i in range(300)])
    assert max(calls) <= 5 and len(calls) <= 2 * 300  # not the whole completion again at every token


def test_the_tokens_of_one_step_decode_together_unless_a_stop_string_needs_each_ones_text():
    calls = []

    def counting(ids) -> str:
        calls.append(len(ids))
        return decode(ids)

    steps = [[1, 2, 3, 2] * 8 for _ in range(10)]  # ten steps of 32 tokens
    text = ChoiceText(counting, ())
    assert "".join(text.add(ids, [0.0] * 32)[0] for ids in steps) == decode(sum(steps, []))
    assert len(calls) <= 2 * 10  # two decodes a step, not two a token
    assert text.add([1, 9], [0.0, 0.0]) == ("ab", [1], [0.0])  # half of "é" at the end: it waits, "ab" goes
    calls.clear()
    stopped = ChoiceText(counting, ("END",))
    stopped.add([1, 2, 3, 2] * 8, [0.0] * 32)
    assert len(calls) >= 32  # token by token: each id goes out with its own text
