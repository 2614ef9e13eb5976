import pytest

from tandemrl.backends.stopping import find_stop, tokens_to_keep, truncate_at_stop, validate_stop

PIECES = {0: "ab", 1: "c", 2: "de", 3: "f", 4: "gh", 5: ""}


def decode(ids):
    return "".join(PIECES[i] for i in ids)


def test_validate_stop_accepts_strings_and_names_bad_entries():
    assert validate_stop(None) == ()
    assert validate_stop("x") == ("x",)
    assert validate_stop(["a", "bc"]) == ("a", "bc")
    with pytest.raises(ValueError, match="''"):
        validate_stop(["a", ""])
    with pytest.raises(ValueError, match="3"):
        validate_stop(["a", 3])
    with pytest.raises(ValueError, match="None"):
        validate_stop([None])


def test_find_and_truncate_pick_the_earliest_stop_string():
    assert find_stop("hello world", ("world", "lo")) == 3
    assert find_stop("hello", ("xyz",)) is None
    assert truncate_at_stop("hello world", ("o w", "rld")) == ("hell", True)
    assert truncate_at_stop("hello", ("xyz",)) == ("hello", False)
    assert truncate_at_stop("stop at start", ("stop",)) == ("", True)


def brute_keep(ids, stop):
    for n in range(1, len(ids) + 1):
        if find_stop(decode(ids[:n]), stop) is not None:
            return n
    return None


@pytest.mark.parametrize("stop", [("c",), ("bc",), ("cd",), ("e",), ("fg",), ("h",), ("zz",), ("gh", "cd")])
def test_tokens_to_keep_includes_the_token_that_completes_the_stop_string(stop):
    ids = [0, 1, 5, 2, 3, 4, 0]  # "ab" "c" "" "de" "f" "gh" "ab"
    assert tokens_to_keep(ids, decode, stop) == brute_keep(ids, stop)


def test_tokens_to_keep_examples():
    ids = [0, 1, 2, 3]  # ab|c|de|f
    assert tokens_to_keep(ids, decode, ("cd",)) == 3  # "d" arrives with the third token, which stays
    assert tokens_to_keep(ids, decode, ("a",)) == 1
    assert tokens_to_keep(ids, decode, ("x",)) is None
    assert tokens_to_keep(ids, decode, ()) is None
    assert tokens_to_keep([], decode, ("a",)) is None
