import pytest

from tandemrl.data.synthetic import (
    SYNTHETIC_ALPHABET,
    SYNTHETIC_TASKS,
    make_synthetic,
    synthetic_answers,
    synthetic_chance_accuracy,
)


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_deterministic_and_seed_dependent(task):
    a = make_synthetic(task, 200, seed=3)
    b = make_synthetic(task, 200, seed=3)
    c = make_synthetic(task, 200, seed=4)
    assert [(s.prompt, s.answer) for s in a] == [(s.prompt, s.answer) for s in b]
    assert [(s.prompt, s.answer) for s in a] != [(s.prompt, s.answer) for s in c]
    assert [s.index for s in a] == list(range(200))
    test = make_synthetic(task, 200, seed=3, split="test")
    assert [s.prompt for s in test] != [s.prompt for s in a]


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_answers_are_correct(task):
    answers = set(synthetic_answers(task))
    for s in make_synthetic(task, 500, seed=0):
        assert s.answer in answers
        assert set(s.prompt + s.answer) <= set(SYNTHETIC_ALPHABET)
        if task == "copy":
            assert s.prompt == f"copy {s.answer}:"
        else:
            a, b = s.prompt.rstrip("=").split("+")
            assert int(a) + int(b) == int(s.answer)


def test_task_ranges():
    add = make_synthetic("add", 2000, seed=0)
    assert {s.answer for s in add} == {str(i) for i in range(10)}
    assert add[0].prompt.endswith("=") and len(add[0].answer) == 1
    add2 = make_synthetic("add2", 2000, seed=0)
    assert all(10 <= int(s.answer) <= 99 for s in add2)
    assert all(0 <= int(x) <= 99 for s in add2 for x in s.prompt.rstrip("=").split("+"))


def test_answers_roughly_uniform():
    # Uniform answers: always guessing one answer scores chance, so "x chance" is an honest baseline.
    counts = {}
    for s in make_synthetic("add", 5000, seed=1):
        counts[s.answer] = counts.get(s.answer, 0) + 1
    assert max(counts.values()) / 5000 < 0.13


def test_chance_accuracy():
    assert synthetic_chance_accuracy("add") == pytest.approx(0.1)
    assert synthetic_chance_accuracy("copy") == pytest.approx(0.1)
    assert synthetic_chance_accuracy("add2") == pytest.approx(1 / 90)


def test_errors():
    with pytest.raises(ValueError, match="valid tasks: add, copy, add2"):
        make_synthetic("mul", 10, 0)
    with pytest.raises(ValueError, match="n must be"):
        make_synthetic("add", 0, 0)
    with pytest.raises(ValueError, match="valid tasks"):
        synthetic_chance_accuracy("mul")
