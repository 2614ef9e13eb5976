import random

import numpy as np
import pytest

from tandemrl.engine.ngram import NgramConfig, NgramIndex, propose_batch, propose_ngram

CFG = NgramConfig(min_n=1, max_n=3, num_tokens=4)


def reference(tokens, min_n, max_n, k, prefer="recent"):
    """Plainly: for n = max_n .. min_n, look at every earlier start of the last n tokens (from the end backwards,
    or from the start for "earliest"); the occurrence must end before the last token so that one token follows it."""
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n >= length:
            continue
        suffix = tokens[length - n:]
        starts = range(length - n - 1, -1, -1)  # start s: occurrence tokens[s:s+n], s + n <= length - 1
        if prefer == "earliest":
            starts = reversed(starts)
        for s in starts:
            if tokens[s:s + n] == suffix:
                return tokens[s + n:s + n + k]
    return []


def all_ways(tokens, config):
    """The proposal by each entry point: stateless, index fed token by token, index fed in one bulk call."""
    one_by_one = NgramIndex(config)
    for t in tokens:
        one_by_one.append(t)
    return [propose_ngram(tokens, config), one_by_one.propose(), NgramIndex(config, tokens).propose()]


def assert_all(tokens, config, expected):
    assert all_ways(tokens, config) == [expected] * 3
    assert reference(tokens, config.min_n, config.max_n, config.num_tokens, config.prefer) == expected


def test_a_repeated_phrase_is_proposed():
    # "the cat sat on the mat . the cat" -> "sat on the mat"
    tokens = [10, 11, 12, 13, 10, 14, 15, 10, 11]
    assert_all(tokens, CFG, [12, 13, 10, 14])


def test_the_most_recent_occurrence_wins_and_earliest_is_the_alternative():
    tokens = [1, 2, 7, 7, 30, 1, 2, 8, 8, 31, 1, 2]  # [1, 2] at 0 and at 5; no 3-gram recurs
    assert_all(tokens, CFG, [8, 8, 31, 1])
    assert_all(tokens, NgramConfig(prefer="earliest"), [7, 7, 30, 1])


def test_a_longer_match_beats_a_more_recent_shorter_one():
    # [3, 4, 5] occurs early; [4, 5] (and 5) more recently: n = 3 decides
    tokens = [3, 4, 5, 20, 21, 22, 4, 5, 30, 5, 31, 3, 4, 5]
    assert_all(tokens, CFG, [20, 21, 22, 4])
    assert_all(tokens, NgramConfig(min_n=1, max_n=2), [30, 5, 31, 3])
    assert_all(tokens, NgramConfig(min_n=1, max_n=1), [31, 3, 4, 5])


def test_min_n_excludes_shorter_matches():
    tokens = [1, 2, 3, 4, 9, 8, 4]  # only the unigram [4] recurs
    assert_all(tokens, NgramConfig(min_n=1, max_n=3), [9, 8, 4])
    assert_all(tokens, NgramConfig(min_n=2, max_n=3), [])


def test_no_match_gives_nothing():
    assert_all([1, 2, 3, 4, 5], CFG, [])
    assert_all([], CFG, [])
    assert_all([7], CFG, [])


def test_the_proposal_is_shorter_than_k_where_the_sequence_ends():
    tokens = [1, 2, 3, 9, 1, 2, 3]
    assert_all(tokens, CFG, [9, 1, 2, 3])
    assert_all(tokens, NgramConfig(num_tokens=10), [9, 1, 2, 3])
    assert_all([5, 6, 7, 5, 6], NgramConfig(num_tokens=10), [7, 5, 6])


def test_the_suffix_does_not_match_itself_but_may_overlap_an_occurrence():
    assert_all([4, 5, 6], CFG, [])  # each suffix occurs only as itself
    assert_all([5, 5], CFG, [5])  # [5] at 0, followed by the last token
    assert_all([5, 5, 5], CFG, [5])  # [5, 5] at 0 overlaps the suffix [5, 5] at 1
    assert_all([5, 5, 5, 5, 5, 5], CFG, [5])  # recent: the occurrence ending just before the end
    assert_all([5, 5, 5, 5, 5, 5], NgramConfig(prefer="earliest"), [5, 5, 5])


def test_config_errors_name_the_field():
    for kwargs, field in [({"min_n": 0}, "min_n"), ({"min_n": 1.5}, "min_n"), ({"max_n": 0}, "max_n"),
                          ({"min_n": 3, "max_n": 2}, "max_n"), ({"num_tokens": 0}, "num_tokens"),
                          ({"num_tokens": True}, "num_tokens"), ({"prefer": "first"}, "prefer")]:
        config = NgramConfig(**kwargs)
        with pytest.raises(ValueError, match=f"NgramConfig.{field}"):
            config.validate()
        with pytest.raises(ValueError, match=f"NgramConfig.{field}"):
            propose_ngram([1, 2, 1], config)
        with pytest.raises(ValueError, match=f"NgramConfig.{field}"):
            NgramIndex(config)
    NgramConfig().validate()


def test_placeholders_and_out_of_range_ids_are_refused():
    for bad in (-1, 2**32):
        with pytest.raises(ValueError, match="known token ids"):
            propose_ngram([1, 2, 1, bad], CFG)
        with pytest.raises(ValueError, match="known token ids"):
            propose_batch([[1, 2], [3, bad, 3]], CFG)
        with pytest.raises(ValueError, match="known token ids"):
            NgramIndex(CFG, [1, 2, bad])
        with pytest.raises(ValueError, match="known token ids"):
            NgramIndex(CFG, [1, 2] * 20 + [bad])  # the bulk path
        index = NgramIndex(CFG, [1, 2, 1])
        with pytest.raises(ValueError, match="known token ids"):
            index.append(bad)
        assert len(index) == 3 and index.propose() == [2, 1]  # a refused token leaves the index as it was


def test_numpy_inputs_and_a_per_call_k():
    tokens = np.array([10, 11, 12, 13, 10, 14, 15, 10, 11], dtype=np.int64)
    assert propose_ngram(tokens, CFG) == [12, 13, 10, 14]
    index = NgramIndex(CFG, tokens)
    assert index.propose() == [12, 13, 10, 14]
    assert index.propose(2) == [12, 13] and index.propose(0) == []
    index.append(np.int32(12))
    assert index.propose() == [13, 10, 14, 15] and all(type(t) is int for t in index.propose())
    assert len(index) == 10 and index.token_ids == tokens.tolist() + [12]


def test_a_byte_match_across_two_ids_is_not_a_match():
    # ids packed as little-endian 32-bit words: 256 = 00 01 00 00, 1 = 01 00 00 00; the bytes of [1, 0] at a
    # misaligned offset inside [256, 0] must not count. A property test with small ids would never see this.
    tokens = [256, 0, 0, 7, 1, 0]
    assert_all(tokens, CFG, [7, 1, 0])  # the unigram [0] at 2, not a bogus [1, 0] inside [256, 0]
    assert_all(tokens, NgramConfig(prefer="earliest"), [0, 7, 1, 0])
    tokens = [768, 0, 9, 3]  # 768 = 00 03 00 00: the bytes of [3] at offset 1, and no real earlier 3
    assert_all(tokens, CFG, [])
    assert_all(tokens, NgramConfig(prefer="earliest"), [])
    # a bogus match overlapping a real one: the search past it must still find the real one
    p = 0x01010101  # bytes 01 01 01 01
    tokens = [p, 1, 5, p]  # 01 01 01 01 | 01 00 00 00: bogus [p] at byte 1, more recent than the real one at 0
    assert_all(tokens, CFG, [1, 5, p])
    tokens = [0x01010100, p, 5, p]  # 00 01 01 01 | 01 01 01 01: bogus [p] at byte 1, earlier than the real one at 4
    assert_all(tokens, NgramConfig(prefer="earliest"), [5, p])


@pytest.mark.parametrize("prefer", ["recent", "earliest"])
def test_every_entry_point_equals_the_reference_on_random_sequences(prefer):
    rng = random.Random(1234)
    checked = matched = 0
    for _ in range(600):
        min_n = rng.randint(1, 3)
        config = NgramConfig(min_n=min_n, max_n=rng.randint(min_n, 5), num_tokens=rng.randint(1, 6), prefer=prefer)
        vocab = rng.choice([2, 3, 5, 8, 300])
        sequences = [[rng.randrange(vocab) for _ in range(rng.randint(0, 60))] for _ in range(8)]
        expected = [reference(s, config.min_n, config.max_n, config.num_tokens, prefer) for s in sequences]
        assert propose_batch(sequences, config) == expected
        assert [propose_ngram(s, config) for s in sequences] == expected
        for tokens, want in zip(sequences, expected):
            # an index fed in random chunks (bulk and one-by-one paths) proposes the reference at every prefix
            index, fed = NgramIndex(config), 0
            while fed < len(tokens):
                size = rng.choice([1, 1, 2, 5, 20, 40])
                index.extend(tokens[fed:fed + size])
                fed = min(len(tokens), fed + size)
                assert index.propose() == reference(tokens[:fed], config.min_n, config.max_n,
                                                    config.num_tokens, prefer), (tokens[:fed], config)
            assert index.propose() == want
            checked += 1
            matched += bool(want)
    assert matched > checked // 2 and matched < checked  # the random cases exercise both outcomes


def test_an_index_fed_token_by_token_matches_the_scan_on_a_long_sequence():
    rng = random.Random(7)
    config = NgramConfig(min_n=2, max_n=4, num_tokens=5)
    tokens = [rng.randrange(20) for _ in range(30)]
    index = NgramIndex(config, tokens)
    for _ in range(2000):
        token = rng.randrange(20)
        tokens.append(token)
        index.append(token)
        assert index.propose() == propose_ngram(tokens, config)
