"""Placement groups of a sequence's pages (``gcache.kv.page_keys.groups_of``): the head with the
first page, everything deeper with the first page past the head, decided by a page's own prefix
so that every sequence through a page places it alike."""

from __future__ import annotations

import pytest

from gcache.errors import InvalidRequest
from gcache.kv import page_keys
from gcache.kv.page_keys import groups_of, groups_of_keys, head_groups, head_pages


def test_the_head_goes_with_the_first_page_and_the_rest_with_the_first_page_past_it():
    chain = [f"p{i}" for i in range(7)]
    assert head_groups(chain, 3) == ["p0"] * 3 + ["p3"] * 4
    assert head_groups(chain[:3], 3) == ["p0"] * 3
    assert head_groups(chain[:4], 3) == ["p0"] * 3 + ["p3"]
    assert head_groups([], 3) == []


def test_a_page_is_placed_alike_by_every_sequence_through_it():
    shared = [f"s{i}" for i in range(5)]
    one, two = shared + ["a5", "a6"], shared + ["b5"]
    for head in (1, 2, 4, 8):
        a, b = head_groups(one, head), head_groups(two, head)
        assert a[:5] == b[:5]                              # the shared prefix agrees
        assert head_groups(one[:6], head) == a[:6]         # a prefix's groups are a prefix


def test_sequences_that_share_only_their_head_part_ways_after_it():
    shared = [f"s{i}" for i in range(2)]
    one, two = head_groups(shared + ["a2", "a3"], 2), head_groups(shared + ["b2", "b3"], 2)
    assert one[:2] == two[:2] == ["s0", "s0"]
    assert one[2:] == ["a2", "a2"] and two[2:] == ["b2", "b2"]


def test_the_head_is_counted_in_tokens():
    assert head_pages(16, 1024) == 64
    assert head_pages(512, 1024) == 2
    assert head_pages(4096, 1024) == 1                    # a page longer than the head
    assert head_pages(16, 0) == 1
    with pytest.raises(InvalidRequest, match="page_size"):
        head_pages(0, 1024)


def test_object_keys_take_their_pages_group():
    hashes = [bytes([i]) * 16 for i in range(4)]
    groups = groups_of(hashes, 2)
    assert groups == [hashes[0].hex()] * 2 + [hashes[2].hex()] * 2
    keys = [page_keys.page_key(hashes[3], 0), page_keys.tail_key(hashes[1], 5)]
    assert groups_of_keys(keys, hashes, 2) == [groups[3], groups[1]]
    with pytest.raises(InvalidRequest, match="not a page or tail key"):
        groups_of_keys(["kv/ffff/f0"], hashes, 2)
