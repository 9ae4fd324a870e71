"""Media-aware token ids: page keys that tell images apart and match the same image."""

import numpy as np
import pytest

from gcache.errors import InvalidRequest
from gcache.kv.page_keys import namespace, page_hashes
from gcache.mm import MediaSpan, media_token_ids

PAD = 151655                    # one placeholder id for every image position, as engines use
TEXT = list(range(100, 116))


def prompt(image: str, offset: int = 16, length: int = 32):
    tokens = TEXT + [PAD] * length + TEXT
    return tokens, [MediaSpan(offset, length, image)]


def keys(tokens, media):
    return page_hashes(media_token_ids(tokens, media), 16, namespace("tiny-vl"))


def test_same_text_with_another_image_shares_only_the_pages_before_it():
    a, b = keys(*prompt("sha256:cat")), keys(*prompt("sha256:dog"))
    assert a[0] == b[0]                       # the text before the image
    assert all(x != y for x, y in zip(a[1:], b[1:]))


def test_the_same_image_in_two_prompts_gives_the_same_keys():
    assert keys(*prompt("sha256:cat")) == keys(*prompt("sha256:cat"))


def test_text_tokens_are_unchanged_and_media_ids_never_look_like_text():
    tokens, media = prompt("sha256:cat")
    ids = media_token_ids(tokens, media)
    assert ids.dtype == np.dtype("<i8") and list(ids[:16]) == TEXT and list(ids[48:]) == TEXT
    assert (ids[16:48] >= 1 << 62).all() and len(set(ids[16:48].tolist())) == 32
    assert tokens[16] == PAD                  # the caller's list is not changed


def test_a_span_past_the_end_is_cut_to_the_prompt():
    tokens, media = prompt("sha256:cat")
    short = media_token_ids(tokens[:20], media)
    assert list(short) == list(media_token_ids(tokens, media)[:20])
    assert list(media_token_ids(TEXT, [MediaSpan(40, 8, "x")])) == TEXT
    with pytest.raises(InvalidRequest, match="negative"):
        media_token_ids(TEXT, [MediaSpan(-1, 4, "x")])
