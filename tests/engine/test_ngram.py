import random

import numpy as np
import pytest

from tandemrl.speculative.config import SpeculativeConfig
from tandemrl.speculative.ngram import NgramIndex

CFG = (1, 3, 4)  # min_n, max_n, k


def reference(tokens, min_n, max_n, k):
    """Plainly: for n = max_n .. min_n, look at every earlier start of the last n tokens, from the end backwards; the
    occurrence must end before the last token so that one token follows it."""
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n >= length:
            continue
        suffix = tokens[length - n:]
        for s in range(length - n - 1, -1, -1):  # start s: occurrence tokens[s:s+n], s + n <= length - 1
            if tokens[s:s + n] == suffix:
                return tokens[s + n:s + n + k]
    return []


def all_ways(tokens, config):
    """The proposal of an index fed token by token, and of one fed in one bulk call."""
    min_n, max_n, k = config
    one_by_one = NgramIndex(min_n, max_n)
    for t in tokens:
        one_by_one.extend([t])
    return [one_by_one.propose(k), NgramIndex(min_n, max_n, tokens).propose(k)]


def assert_all(tokens, config, expected):
    assert all_ways(tokens, config) == [expected] * 2
    assert reference(tokens, *config) == expected


def test_a_repeated_phrase_is_proposed():
    # "the cat sat on the mat . the cat" -> "sat on the mat"
    tokens = [10, 11, 12, 13, 10, 14, 15, 10, 11]
    assert_all(tokens, CFG, [12, 13, 10, 14])


def test_the_most_recent_occurrence_wins():
    tokens = [1, 2, 7, 7, 30, 1, 2, 8, 8, 31, 1, 2]  # [1, 2] at 0 and at 5; no 3-gram recurs
    assert_all(tokens, CFG, [8, 8, 31, 1])


def test_a_longer_match_beats_a_more_recent_shorter_one():
    # [3, 4, 5] occurs early; [4, 5] (and 5) more recently: n = 3 decides
    tokens = [3, 4, 5, 20, 21, 22, 4, 5, 30, 5, 31, 3, 4, 5]
    assert_all(tokens, CFG, [20, 21, 22, 4])
    assert_all(tokens, (1, 2, 4), [30, 5, 31, 3])
    assert_all(tokens, (1, 1, 4), [31, 3, 4, 5])


def test_min_n_excludes_shorter_matches():
    tokens = [1, 2, 3, 4, 9, 8, 4]  # only the unigram [4] recurs
    assert_all(tokens, (1, 3, 4), [9, 8, 4])
    assert_all(tokens, (2, 3, 4), [])


def test_no_match_gives_nothing():
    assert_all([1, 2, 3, 4, 5], CFG, [])
    assert_all([], CFG, [])
    assert_all([7], CFG, [])


def test_the_proposal_is_shorter_than_k_where_the_sequence_ends():
    tokens = [1, 2, 3, 9, 1, 2, 3]
    assert_all(tokens, CFG, [9, 1, 2, 3])
    assert_all(tokens, (1, 3, 10), [9, 1, 2, 3])
    assert_all([5, 6, 7, 5, 6], (1, 3, 10), [7, 5, 6])


def test_the_suffix_does_not_match_itself_but_may_overlap_an_occurrence():
    assert_all([4, 5, 6], CFG, [])  # each suffix occurs only as itself
    assert_all([5, 5], CFG, [5])  # [5] at 0, followed by the last token
    assert_all([5, 5, 5], CFG, [5])  # [5, 5] at 0 overlaps the suffix [5, 5] at 1
    assert_all([5, 5, 5, 5, 5, 5], CFG, [5])  # recent: the occurrence ending just before the end


def test_config_errors_name_the_field():
    for kwargs, field in [({"ngram_min": 0}, "ngram_min"), ({"ngram_min": 1.5}, "ngram_min"),
                          ({"ngram_max": 0}, "ngram_max"), ({"ngram_min": 3, "ngram_max": 2}, "ngram_min"),
                          ({"num_tokens": 0}, "num_tokens"), ({"num_tokens": True}, "num_tokens")]:
        with pytest.raises(ValueError, match=f"speculative.{field}"):
            SpeculativeConfig(method="ngram", **kwargs).validate()
    SpeculativeConfig(method="ngram").validate()


def test_placeholders_and_out_of_range_ids_are_refused():
    for bad in (-1, 2**32):
        with pytest.raises(ValueError, match="known token ids"):
            NgramIndex(1, 3, [1, 2, bad])
        with pytest.raises(ValueError, match="known token ids"):
            NgramIndex(1, 3, [1, 2] * 20 + [bad])  # the bulk path
        index = NgramIndex(1, 3, [1, 2, 1])
        with pytest.raises(ValueError, match="known token ids"):
            index.extend([bad])
        assert len(index) == 3 and index.propose(4) == [2, 1]  # a refused token leaves the index as it was


def test_numpy_inputs_and_a_per_call_k():
    tokens = np.array([10, 11, 12, 13, 10, 14, 15, 10, 11], dtype=np.int64)
    index = NgramIndex(1, 3, tokens)
    assert index.propose(4) == [12, 13, 10, 14]
    assert index.propose(2) == [12, 13] and index.propose(0) == []
    index.extend(np.array([12], dtype=np.int32))
    assert index.propose(4) == [13, 10, 14, 15] and all(type(t) is int for t in index.propose(4))
    assert len(index) == 10


def test_a_byte_match_across_two_ids_is_not_a_match():
    # ids packed as little-endian 32-bit words: 256 = 00 01 00 00, 1 = 01 00 00 00; the bytes of [1, 0] at a
    # misaligned offset inside [256, 0] must not count. A property test with small ids would never see this.
    tokens = [256, 0, 0, 7, 1, 0]
    assert_all(tokens, CFG, [7, 1, 0])  # the unigram [0] at 2, not a bogus [1, 0] inside [256, 0]
    tokens = [768, 0, 9, 3]  # 768 = 00 03 00 00: the bytes of [3] at offset 1, and no real earlier 3
    assert_all(tokens, CFG, [])
    # a bogus match overlapping a real one: the search past it must still find the real one
    p = 0x01010101  # bytes 01 01 01 01
    tokens = [p, 1, 5, p]  # 01 01 01 01 | 01 00 00 00: bogus [p] at byte 1, more recent than the real one at 0
    assert_all(tokens, CFG, [1, 5, p])


def test_every_entry_point_equals_the_reference_on_random_sequences():
    rng = random.Random(1234)
    checked = matched = 0
    for _ in range(600):
        min_n = rng.randint(1, 3)
        config = (min_n, rng.randint(min_n, 5), rng.randint(1, 6))
        vocab = rng.choice([2, 3, 5, 8, 300])
        sequences = [[rng.randrange(vocab) for _ in range(rng.randint(0, 60))] for _ in range(8)]
        expected = [reference(s, *config) for s in sequences]
        assert [NgramIndex(config[0], config[1], s).propose(config[2]) for s in sequences] == expected
        for tokens, want in zip(sequences, expected):
            # an index fed in random chunks (bulk and one-by-one paths) proposes the reference at every prefix
            index, fed = NgramIndex(config[0], config[1]), 0
            while fed < len(tokens):
                size = rng.choice([1, 1, 2, 5, 20, 40])
                index.extend(tokens[fed:fed + size])
                fed = min(len(tokens), fed + size)
                assert index.propose(config[2]) == reference(tokens[:fed], *config), (tokens[:fed], config)
            assert index.propose(config[2]) == want
            checked += 1
            matched += bool(want)
    assert matched > checked // 2 and matched < checked  # the random cases exercise both outcomes


def test_an_index_fed_token_by_token_matches_the_reference_on_a_long_sequence():
    rng = random.Random(7)
    tokens = [rng.randrange(20) for _ in range(30)]
    index = NgramIndex(2, 4, tokens)
    for _ in range(2000):
        token = rng.randrange(20)
        tokens.append(token)
        index.extend([token])
        assert index.propose(5) == reference(tokens, 2, 4, 5)
