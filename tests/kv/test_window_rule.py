"""The window-safe rule as tables, the page keys it is applied to, and the store policies."""

import numpy as np
import pytest

from gcache.errors import ConfigError, InvalidRequest
from gcache.kv import page_hashes, policy_from_name, safe_boundary, tail_span
from gcache.kv.page_keys import namespace
from gcache.kv.policy import Pressure

T, F = True, False


@pytest.mark.parametrize("pages, tails, expected", [
    ([T, T, T, T], {4}, 4),                  # all there
    ([T, T, T, T], {2}, 2),                  # end tail missing: back to the last safe tail
    ([T, T, T, T], set(), 0),                # full pages alone are never a hit
    ([T, F, T, T], {4}, 0),                  # a page missing in the middle breaks the prefix
    ([T, F, T, T], {1, 4}, 1),
    ([T, T, F, T], {1, 2, 3, 4}, 2),         # tails beyond a missing page do not count
    ([T, T, T, T], {1, 3}, 3),               # tails missing in the middle: the best left
    ([F, T, T, T], {1, 2, 3, 4}, 0),
    ([], set(), 0),
])
def test_safe_boundary_table(pages, tails, expected):
    assert safe_boundary(len(pages), pages, lambda b: b in tails) == expected


def test_models_without_swa_or_without_full_layers():
    assert safe_boundary(3, [T, T, F], None) == 2           # plain full attention
    assert safe_boundary(3, None, lambda b: b == 2) == 2    # every layer sliding


@pytest.mark.parametrize("boundary, page, window, span", [
    (4, 64, 128, (128, 256)),      # W a multiple of P: two whole pages
    (4, 64, 100, (156, 256)),      # W not a multiple of P: part of a page
    (1, 512, 128, (384, 512)),     # W smaller than a page: never the whole page
    (1, 64, 128, (0, 64)),         # prefix shorter than W: the whole prefix
    (3, 48, 128, (16, 144)),
])
def test_tail_spans_are_exactly_the_window(boundary, page, window, span):
    assert tail_span(boundary, page, window) == span


def test_page_hashes_chain_and_share_exactly_while_prefixes_agree():
    root = namespace("m")
    a = np.arange(40)
    b = np.concatenate([np.arange(20), np.arange(100, 120)])
    ha, hb = page_hashes(a, 8, root), page_hashes(b, 8, root)
    assert len(ha) == 5 and ha[:2] == hb[:2] and ha[2] != hb[2]
    assert ha[3] != hb[3] and len(set(ha)) == 5
    assert page_hashes(a[:39], 8, root) == ha[:4]           # a partial page gets no hash
    assert page_hashes(a, 8, namespace("other"))[0] != ha[0]
    assert page_hashes(list(range(40)), 8, root) == ha


@pytest.mark.parametrize("tokens, match", [
    ([[1, 2], [3, 4]], "one-dimensional"), ([1.5, 2.0], "integers"), ([3, -1], "non-negative"),
])
def test_bad_token_ids_are_refused(tokens, match):
    with pytest.raises(InvalidRequest, match=match):
        page_hashes(tokens, 2, b"r")


@pytest.mark.parametrize("name, n, shared, hit, pressure, expected", [
    ("tail", 10, 6, 0, Pressure.EVICTING, [10]),
    ("checkpoint-4", 10, 0, 0, Pressure.EVICTING, [4, 8, 10]),
    ("checkpoint-4", 8, 0, 0, Pressure.EVICTING, [4, 8]),
    ("full-layer", 10, 0, 0, Pressure.EVICTING, []),
    ("adaptive", 40, 6, 2, Pressure.EVICTING, [6, 16, 32, 40]),   # branch point at 6
    ("adaptive", 40, 6, 6, Pressure.EVICTING, [16, 32, 40]),      # 6 already hits
    ("adaptive", 10, 0, 0, Pressure.FILLING, [4, 8, 10]),
    ("adaptive", 4, 0, 0, Pressure.ROOMY, [1, 2, 3, 4]),
    ("tail", 0, 0, 0, Pressure.ROOMY, []),
])
def test_policy_tail_boundaries(name, n, shared, hit, pressure, expected):
    policy = policy_from_name(name)
    assert policy.tail_boundaries(n, shared_pages=shared, hit_pages=hit,
                                  pressure=pressure) == expected


@pytest.mark.parametrize("name", ["checkpoint-0", "checkpoint-x", "lru", ""])
def test_unknown_policies_list_the_valid_ones(name):
    with pytest.raises(ConfigError, match="adaptive"):
        policy_from_name(name)
