"""vLLM's KV event batches (as its ZMQ publisher encodes them) into a view, and the subscriber
reading them from a real ZMQ socket."""

import time

import msgspec
import pytest
import zmq

from gcache.router.kv_events import EventFeed, EventSubscriber, view_hashes
from gcache.router.views import PrefixView

BLOCK = 4
TOKENS = list(range(100, 116))            # four blocks
HASHES = view_hashes(TOKENS, BLOCK)


def stored(engine_hashes, tokens, parent=None, *, medium="GPU", kind="full_attention",
           group=0, block_size=BLOCK, ownership=None):
    return {"type": "BlockStored", "block_hashes": engine_hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": block_size, "lora_id": None, "medium": medium,
            "lora_name": None, "extra_keys": [None] * len(engine_hashes), "group_idx": group,
            "kv_cache_spec_kind": kind, "ownership": ownership}


def removed(engine_hashes, *, medium="GPU", group=0):
    return {"type": "BlockRemoved", "block_hashes": engine_hashes, "medium": medium,
            "group_idx": group}


def batch(*events):
    return [time.time(), list(events), 0]


def feed():
    view = PrefixView(100, stale_after_s=60)
    return EventFeed(view, BLOCK), view


def test_stored_blocks_chain_through_their_parents_into_the_prompts_hashes():
    events, view = feed()
    events.apply(0, batch(stored([11, 12], TOKENS[:8])))
    events.apply(1, batch(stored([13, 14], TOKENS[8:], parent=12)))
    assert view.hit_pages(HASHES) == 4
    assert view.hit_pages(view_hashes(TOKENS[:8] + [1, 2, 3, 4], BLOCK)) == 2


def test_a_block_whose_parent_was_never_seen_is_skipped_not_guessed():
    events, view = feed()
    events.apply(0, batch(stored([13, 14], TOKENS[8:], parent=12)))
    assert len(view) == 0 and events.skipped == 2


def test_removed_blocks_leave_the_view_and_a_cpu_copy_keeps_the_host_tier():
    events, view = feed()
    events.apply(0, batch(stored([11, 12, 13, 14], TOKENS)))
    events.apply(1, batch(stored([11, 12], TOKENS[:8], medium="CPU")))
    events.apply(2, batch(removed([12, 13, 14])))
    assert view.hit_pages(HASHES, tier="gpu") == 1
    assert view.hit_pages(HASHES, tier="host") == 2


def test_a_secondary_tiers_events_are_not_the_engines_memory():
    events, view = feed()
    events.apply(0, batch(stored([11, 12], TOKENS[:8], medium="CPU", ownership="gcache")))
    assert len(view) == 0                       # GCacheTier's: the router asks GCache itself
    events.apply(1, batch(stored([11, 12], TOKENS[:8], medium="CPU")))
    assert view.hit_pages(HASHES, tier="host") == 2


def test_a_sliding_window_groups_events_never_feed_the_view():
    events, view = feed()
    events.apply(0, batch(stored([21, 22], TOKENS[:8], kind="sliding_window", group=1)))
    assert len(view) == 0
    events.apply(1, batch(stored([11, 12], TOKENS[:8]), removed([21, 22], group=1)))
    assert view.hit_pages(HASHES) == 2


@pytest.mark.parametrize("next_seq, why", [(0, "engine restarted"), (5, "events dropped")])
def test_a_sequence_that_restarts_or_skips_clears_the_view(next_seq, why):
    events, view = feed()
    events.apply(0, batch(stored([11, 12], TOKENS[:8])))
    events.apply(1, batch(stored([13], TOKENS[8:12], parent=12)))
    events.apply(next_seq, batch())
    assert len(view) == 0, why
    events.apply(next_seq + 1, batch(stored([13], TOKENS[8:12], parent=12)))
    assert len(view) == 0, "the old names went with the view"


def test_all_blocks_cleared_empties_the_view():
    events, view = feed()
    events.apply(0, batch(stored([11, 12], TOKENS[:8])))
    events.apply(1, batch({"type": "AllBlocksCleared"}))
    assert len(view) == 0


def test_blocks_of_another_block_size_are_skipped():
    events, view = feed()
    events.apply(0, batch(stored([11], TOKENS[:8], block_size=8)))
    assert len(view) == 0 and events.skipped == 1


def test_the_subscriber_reads_a_real_publisher(tmp_path):
    endpoint = f"ipc://{tmp_path}/kv.sock"
    publisher = zmq.Context.instance().socket(zmq.PUB)
    publisher.bind(endpoint)
    events, view = feed()
    subscriber = EventSubscriber(endpoint, events, name="t")
    try:
        encode = msgspec.msgpack.Encoder().encode
        deadline = time.monotonic() + 10
        seq = 0
        while view.hit_pages(HASHES) < 4:     # a SUB joins late: publish until it hears
            assert time.monotonic() < deadline, "the subscriber heard nothing"
            publisher.send_multipart([b"kv", seq.to_bytes(8, "big"),
                                      encode(batch(stored([11, 12, 13, 14], TOKENS)))])
            publisher.send_multipart([b"kv", (seq + 1).to_bytes(8, "big"), b"\xc1junk"])
            seq += 2
            time.sleep(0.05)
    finally:
        subscriber.close()
        publisher.close(linger=0)
    assert view.hit_pages(HASHES) == 4
