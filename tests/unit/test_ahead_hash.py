"""``AheadHash``: a value's checksum fed in order from wherever a put stops and resumes."""

from __future__ import annotations

import os

from gcache.keys import HASH_PIECE, checksum
from gcache.sdk.ahead_hash import AheadHash


def test_any_split_between_until_and_through_gives_the_whole_values_checksum():
    value = memoryview(os.urandom(3 * HASH_PIECE + 1234))
    for stops_after in (0, 1, 2, 5):
        calls = []

        def stop() -> bool:
            calls.append(1)
            return len(calls) > stops_after

        ahead = AheadHash(value)
        ahead.until(stop)
        assert ahead.hashed == min(len(value), stops_after * HASH_PIECE)
        for end in (10, HASH_PIECE + 7, 2 * HASH_PIECE, 2 * HASH_PIECE):   # behind, ahead, again
            ahead.through(end)
            assert ahead.hashed == max(min(len(value), stops_after * HASH_PIECE), end)
        assert ahead.digest() == checksum(value) and ahead.hashed == len(value)


def test_a_value_smaller_than_a_piece_is_hashed_once():
    value = memoryview(b"x" * 100)
    ahead = AheadHash(value)
    ahead.until(lambda: False)
    assert ahead.hashed == 100
    ahead.through(1 << 30)
    assert ahead.digest() == checksum(value)
