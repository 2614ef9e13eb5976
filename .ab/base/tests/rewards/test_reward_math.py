import pytest

from tandemrl.rewards.math import answers_match, extract_answer, find_boxed, parse_number


@pytest.mark.parametrize(
    "text, expected",
    [
        ("$1,234.", 1234.0),
        ("1,234,567", 1234567.0),
        ("  42  ", 42.0),
        ("**42**", 42.0),
        ("42.", 42.0),
        ("3.5.", 3.5),
        ("-7", -7.0),
        ("−7", -7.0),
        ("50%", 50.0),
        ("50\\%", 50.0),
        ("3/4", 0.75),
        ("-3/4", -0.75),
        ("\\frac{3}{4}", 0.75),
        ("-\\frac{3}{4}", -0.75),
        ("\\dfrac{1}{8}", 0.125),
        ("\\frac34", 0.75),
        ("\\$5", 5.0),
        ("$-5$", -5.0),
        ("\\(12\\)", 12.0),
        ("18\\text{ dollars}", 18.0),
        (".5", 0.5),
        (7, 7.0),
    ],
)
def test_parse_number_accepts(text, expected):
    assert parse_number(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", [None, "", " . ", "-", "1,5", "12 apples", "1 2", "inf", "nan", "1/0", "abc", True])
def test_parse_number_rejects(text):
    assert parse_number(text) is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 42.", "42."),
        ("so she earns 10.\n#### 72", "72"),
        ("#### 72 clips", "72"),
        ("#### $1,234.", "$1,234."),
        ("first #### 1\nthen #### 2", "2"),
        ("x = \\boxed{\\frac{3}{4}} done", "\\frac{3}{4}"),
        ("\\boxed{1} then \\boxed{{2}}", "{2}"),
        ("\\boxed{5} but #### 6", "5"),  # boxed wins over ####
        ("#### 6 and the answer is 7", "6"),  # #### wins over 'answer is'
        ("The final answer: $18", "$18"),
        ("The answer is banana.", "banana"),
        ("I get 5-3=2 apples", "2"),
        ("from 5 we go to -3", "-3"),
        ("so 3/4 of it", "3/4"),
        ("no numbers here", None),
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_find_boxed_nested_and_unbalanced():
    assert find_boxed("\\boxed{\\frac{1}{2}+\\sqrt{3}}") == "\\frac{1}{2}+\\sqrt{3}"
    assert find_boxed("\\boxed{7} and \\boxed{8") == "7"
    assert find_boxed("nothing") is None


@pytest.mark.parametrize(
    "pred, gold, ok",
    [
        ("\\frac{3}{4}", "0.75", True),
        (extract_answer("\\boxed{\\frac{3}{4}}"), "0.75", True),
        ("$1,234.", "1234", True),
        (extract_answer("The answer is 42."), "42", True),
        (extract_answer("#### 72"), "72", True),
        ("72.0", "72", True),
        ("72.1", "72", False),
        ("50%", "50", True),
        ("-5", "5", False),
        (None, "5", False),
        ("Banana", "banana", True),
        ("x + 1", "x+1", True),
        ("apple", "banana", False),
        ("", "", False),
    ],
)
def test_answers_match(pred, gold, ok):
    assert answers_match(pred, gold) is ok


def test_answers_match_tolerance():
    assert answers_match("1000000.5", "1000000")
    assert not answers_match("1000000.5", "1000000", rel_tol=1e-9)


def test_random_text_never_raises():
    import random
    import string

    from tandemrl.rewards.functions import accuracy, format_reward

    alphabet = string.digits * 3 + string.ascii_letters + string.punctuation + " \n" + "\\{}#" * 3
    rng = random.Random(0)
    texts = ["e4", "1e", ".", "-.", "\\frac{}{}", "\\boxed{", "#### ", "1/", "/2", "1,,2", "--1", "+", "1e999"]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(20000)]
    for t in texts:
        parse_number(t)
        answers_match(extract_answer(t), "7")
    accuracy([""] * len(texts), texts, answer=["7"] * len(texts))
    format_reward([""] * len(texts), texts)
    assert parse_number("1e999") is None and parse_number("e4") is None
