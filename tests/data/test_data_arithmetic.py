"""arith2: two-digit + - * problems, a fixed held-out set disjoint from train, answers the reward can check."""

import pytest

from tandemrl.data.arithmetic import HELD_OUT_SIZE, OPERANDS
from tandemrl.data.tasks import format_prompt, load_task
from tandemrl.models.tokenizer import build_char_tokenizer
from tandemrl.rewards.functions import accuracy as accuracy_reward

def test_held_out_set_is_fixed_across_seeds_and_never_trained_on():
    test = load_task("arith2", "test", seed=0)
    assert len(test) == HELD_OUT_SIZE >= 500
    assert [s.prompt for s in load_task("arith2", "test", seed=7)] == [s.prompt for s in test]
    # pinned: a change of the generator would silently move every reported before/after number
    assert [s.prompt for s in test[:3]] == ["What is 51 - 22?", "What is 75 * 33?", "What is 65 * 27?"]
    assert [s.prompt for s in load_task("arith2", "test", limit=500, seed=3)] == [s.prompt for s in test[:500]]
    train = load_task("arith2", "train", seed=0)
    assert len(train) == 3 * len(OPERANDS) ** 2 - HELD_OUT_SIZE
    assert not {s.prompt for s in test} & {s.prompt for s in train}
    other_seed = load_task("arith2", "train", seed=1, limit=50)
    assert [s.prompt for s in other_seed] != [s.prompt for s in train[:50]]

def test_problems_are_two_digit_with_all_three_operations_and_correct_answers():
    samples = load_task("arith2", "test", seed=0)
    assert {s.columns["operation"] for s in samples} == {"+", "-", "*"}
    for s in samples:
        _, _, a, op, b = s.prompt.rstrip("?").split(" ")
        assert s.prompt == f"What is {a} {op} {b}?" and 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert int(s.answer) == {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
    assert any(int(s.answer) < 0 for s in samples)

def test_the_last_number_of_a_completion_is_scored():
    sample = next(s for s in load_task("arith2", "test", seed=0) if s.columns["operation"] == "-" and int(s.answer) < 0)
    right = f"{sample.prompt[8:-1]} = {sample.answer}"  # e.g. "23 - 47 = -24"
    wrong = f"The answer is {int(sample.answer) + 1}."
    assert accuracy_reward([sample.prompt] * 2, [right, wrong], answer=[sample.answer] * 2) == [1.0, 0.0]

def test_usable_with_a_chat_template_and_errors_name_the_problem():
    sample = load_task("arith2", "test", limit=1, seed=0)[0]
    text = format_prompt(sample, build_char_tokenizer(), use_chat_template=True)
    assert text == f"<|im_start|>user\n{sample.prompt}<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match="holds out 1000 test problems"):
        load_task("arith2", "test", limit=1001, seed=0)
    with pytest.raises(ValueError, match="takes no data path"):
        load_task("arith2", "test", path="x", seed=0)
    with pytest.raises(ValueError, match="splits train, test"):
        load_task("arith2", "validation", seed=0)
