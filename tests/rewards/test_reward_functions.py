import sys

import pytest

from tandemrl.rewards.functions import (
    REWARD_FUNCTIONS,
    accuracy,
    format_reward,
    has_final_answer,
    length_penalty,
    register_reward,
    resolve_reward,
)


def test_registry_has_builtin_rewards():
    assert {"accuracy", "format", "length_penalty"} <= set(REWARD_FUNCTIONS)
    assert resolve_reward("accuracy") is accuracy
    assert resolve_reward("format") is format_reward


def test_accuracy():
    completions = ["so #### 72", "The answer is 41.", "\\boxed{\\frac{3}{4}}", "7", "no idea"]
    answers = ["72", "42", "0.75", "7", "1"]
    assert accuracy([""] * 5, completions, answer=answers, other=[0] * 5) == [1.0, 0.0, 1.0, 1.0, 0.0]


def test_accuracy_conversational_completion():
    completion = [{"role": "assistant", "content": "#### 5"}]
    assert accuracy(["p"], [completion], answer=["5"]) == [1.0]


def test_accuracy_needs_answer_column():
    with pytest.raises(ValueError, match="'answer' column"):
        accuracy(["p"], ["1"], question=["q"])
    with pytest.raises(ValueError, match="1 values for 2 completions"):
        accuracy(["p", "p"], ["1", "2"], answer=["1"])


@pytest.mark.parametrize(
    "text, ok",
    [
        ("steps...\n#### 72", True),
        ("#### 1,234.", True),
        ("**#### 72**", True),
        ("The answer is \\boxed{5}.", True),
        ("\\[\\boxed{\\frac{3}{4}}\\]", True),
        ("7", True),
        (" 12\n", True),
        ("#### 72 clips", False),
        ("\\boxed{5} and then more text", False),
        ("the answer is 7", False),
        ("7 7", False),
        ("", False),
    ],
)
def test_format(text, ok):
    assert has_final_answer(text) is ok
    assert format_reward(["p"], [text]) == [1.0 if ok else 0.0]


def test_length_penalty():
    assert length_penalty(["p", "p"], ["", "x" * 5000]) == [0.0, -1.0]


def test_resolve_module_function():
    fn = resolve_reward("tandemrl.rewards.math:parse_number")
    assert fn("3") == 3.0


@pytest.mark.parametrize(
    "name, message",
    [
        ("nope", "registered rewards: accuracy"),
        ("no_such_module_xyz:fn", "cannot import module"),
        ("tandemrl.rewards.math:missing", "has no attribute"),
        ("tandemrl.rewards.functions:LENGTH_PENALTY_CHARS", "not callable"),
    ],
)
def test_resolve_errors(name, message):
    with pytest.raises(ValueError, match=message):
        resolve_reward(name)


def test_unknown_reward_mentions_module_form():
    with pytest.raises(ValueError, match="package.module:function"):
        resolve_reward("nope")


def test_register_reward_rejects_clashes():
    @register_reward("test_only_reward")
    def test_only_reward(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    try:
        assert resolve_reward("test_only_reward") is test_only_reward
        with pytest.raises(ValueError, match="already registered"):
            register_reward("test_only_reward")(accuracy)
        with pytest.raises(ValueError, match="without ':'"):
            register_reward("a:b")
    finally:
        del REWARD_FUNCTIONS["test_only_reward"]


def test_format_bare_number_bounded_by_gold_length():
    completions = ["7", "222222", "12", "#### 99999", "1,234"]
    golds = ["3", "3", "42", "3", "1234"]
    assert format_reward(["p"] * 5, completions, answer=golds) == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert has_final_answer("222222") is True  # no gold: any bare number
    with pytest.raises(ValueError, match="1 values for 2"):
        format_reward(["p", "p"], ["1", "2"], answer=["1"])


def test_gsm8k_reference_solutions_score_full_marks():
    from pathlib import Path

    from tandemrl.data.gsm8k import load_gsm8k

    shared = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "gsm8k"
    if not shared.is_dir():
        pytest.skip("shared GSM8K copy not present")
    samples = load_gsm8k(str(shared), "test")
    solutions = [s.columns["solution"] for s in samples]
    answers = [s.answer for s in samples]
    assert accuracy([""] * len(samples), solutions, answer=answers) == [1.0] * len(samples)
    assert format_reward([""] * len(samples), solutions, answer=answers) == [1.0] * len(samples)


def test_reward_module_in_working_directory_imports_without_pythonpath(tmp_path, monkeypatch):
    # TRL users keep reward functions in ./myrewards.py next to their config and expect it to just import.
    (tmp_path / "tandem_cwd_rewards.py").write_text(
        "def fn(prompts, completions, **kwargs):\n    return [1.0 for _ in completions]\n"
    )
    monkeypatch.chdir(tmp_path)
    path_before = list(sys.path)
    try:
        fn = resolve_reward("tandem_cwd_rewards:fn")
        assert fn(["p"], ["c"]) == [1.0]
        assert sys.path == path_before  # the working directory is not left on sys.path
    finally:
        sys.modules.pop("tandem_cwd_rewards", None)


def test_missing_module_in_working_directory_names_reward_and_module(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path_before = list(sys.path)
    with pytest.raises(ValueError, match=r"reward 'tandem_absent_rewards:fn'.*module 'tandem_absent_rewards'"):
        resolve_reward("tandem_absent_rewards:fn")
    assert sys.path == path_before


def test_dependency_missing_inside_cwd_module_is_reported(tmp_path, monkeypatch):
    (tmp_path / "tandem_cwd_broken.py").write_text("import tandem_no_such_dependency_xyz\n")
    monkeypatch.chdir(tmp_path)
    try:
        with pytest.raises(ValueError, match="tandem_no_such_dependency_xyz"):
            resolve_reward("tandem_cwd_broken:fn")
    finally:
        sys.modules.pop("tandem_cwd_broken", None)


def test_a_typo_of_a_registered_reward_suggests_it():
    with pytest.raises(ValueError, match=r"unknown reward 'acuracy' \(did you mean 'accuracy'\?\); registered"):
        resolve_reward("acuracy")


def test_a_missing_function_lists_the_callables_its_file_defines(tmp_path):
    file = tmp_path / "rewards2.py"
    file.write_text("from math import sqrt\n\n\ndef short(completions, **kwargs):\n    return [1.0]\n\n\n"
                    "async def longer(completions, **kwargs):\n    return [0.0]\n\n\ndef _helper():\n    pass\n")
    with pytest.raises(ValueError) as err:
        resolve_reward(f"{file}:shrt")
    assert str(err.value).endswith(
        "has no attribute 'shrt' (did you mean 'short'?); the callables it defines: longer, short")
    with pytest.raises(ValueError, match=r"has no attribute 'zzz'; the callables it defines: longer, short$"):
        resolve_reward(f"{file}:zzz")  # nothing close: no suggestion; what it imports (sqrt) is not listed
    empty = tmp_path / "empty.py"
    empty.write_text("LIMIT = 3\n")
    with pytest.raises(ValueError, match="has no attribute 'f'; it defines no functions$"):
        resolve_reward(f"{empty}:f")


@pytest.mark.parametrize("recorded", ["inline:correct", "inline:1-correct"])
def test_an_inline_reward_says_it_was_a_callable_and_how_to_pass_it_again(recorded):
    """What the Python API records for a callable (tandemrl.train.inputs.reward_record) is not an importable name."""
    with pytest.raises(ValueError) as err:
        resolve_reward(recorded)
    message = str(err.value)
    assert "cannot import" not in message
    assert f"reward '{recorded}' was a Python callable (correct)" in message and "not saved with the run" in message
    assert "Trainer(..., reward_funcs=[correct], out_dir=<the run>).evaluate()" in message
    assert """--set 'reward.functions=["file.py:correct"]'""" in message
