"""``Prefetches``, the scheduler's account of encoder outputs read ahead (V2 runners), on a
clock of its own: which items hold a request back, when the scheduler may skip the encoder, and
what the workers are told to drop."""

from __future__ import annotations

from gcache_vllm.ec_prefetch import Prefetches


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def prefetches(held: set[str], clock: Clock) -> tuple[Prefetches, list[str]]:
    asked: list[str] = []

    def exists(identifier: str) -> bool:
        asked.append(identifier)
        return identifier in held
    return Prefetches(exists, load_wait_s=2.0, budget=1000, claim_s=30.0, refuse_s=10.0,
                      clock=clock), asked


def items(*identifiers: str, embeddings: int = 100) -> list[tuple[str, int]]:
    return [(i, embeddings) for i in identifiers]


def test_a_held_item_holds_its_request_back_until_the_workers_have_read_it():
    clock = Clock()
    p, asked = prefetches({"img"}, clock)
    assert p.available(items("img", "other")) is False       # "other" is encoded; "img" is read
    assert asked == ["img", "other"]
    assert p.take_step() == (["img"], [])
    assert not p.ready("img") and p.available(items("img")) is False
    assert p.take_step() == ([], [])                    # asked once, not every step
    p.reported(loaded={"img"}, failed=set())
    assert p.ready("img") and p.available(items("img")) is True
    p.allocated("img")                                  # the scheduler took it: vLLM frees it
    assert not p.ready("img") and p.available(items("img")) is True
    clock.now += 60
    assert p.take_step() == ([], [])                    # claimed: never dropped
    p.freed(["img"])
    assert p.available(items("img")) is False                # freed by vLLM: read again


def test_a_read_that_fails_makes_the_item_a_miss_for_a_while():
    clock = Clock()
    p, asked = prefetches({"img"}, clock)
    assert p.available(items("img")) is False
    p.take_step()
    p.reported(loaded=set(), failed={"img"})
    assert p.available(items("img")) is True and not p.ready("img")   # encode it
    assert p.take_step() == ([], ["img"])               # any worker that read it drops it
    assert asked == ["img"]
    clock.now += 11
    p.take_step()
    assert p.available(items("img")) is False                # asked again after refuse_s


def test_workers_that_never_answer_cost_load_wait_s_then_the_item_is_encoded():
    clock = Clock()
    p, _ = prefetches({"img"}, clock)
    assert p.available(items("img")) is False
    p.take_step()
    clock.now += 1.9
    assert p.available(items("img")) is False
    clock.now += 0.2
    assert p.available(items("img")) is True and not p.ready("img")
    assert p.counters["gave_up"] == 1
    p.reported(loaded={"img"}, failed=set())            # a late answer: not used, dropped
    assert not p.ready("img")
    assert p.take_step() == ([], ["img"])


def test_an_item_no_request_claims_is_dropped_from_the_workers_unless_vllm_holds_it():
    clock = Clock()
    p, _ = prefetches({"a", "b"}, clock)
    assert p.available(items("a", "b")) is False
    p.take_step()
    p.reported(loaded={"a", "b"}, failed=set())
    clock.now += 31                                     # the request was aborted meanwhile
    p.allocated("b")                                    # another request encoded b: vLLM's
    assert p.take_step() == ([], ["a"])
    assert not p.ready("a") and p.counters["dropped"] == 1


def test_reads_ahead_wait_for_room_past_the_budget_but_one_is_always_read():
    clock = Clock()
    p, _ = prefetches({"a", "b", "huge"}, clock)
    assert p.available(items("a", embeddings=600)) is False
    assert p.available(items("b", embeddings=600)) is False     # no room: not read yet
    assert p.take_step() == (["a"], []) and p.counters["waits_for_room"] == 1
    p.reported(loaded={"a"}, failed=set())
    assert p.available(items("b", embeddings=600)) is False     # a is ready, unclaimed
    p.allocated("a")                                            # claimed: room again
    assert p.available(items("b", embeddings=600)) is False
    assert p.take_step() == (["b"], [])
    p.reported(loaded=set(), failed={"b"})
    assert p.available(items("huge", embeddings=5000)) is False  # alone: read all the same
    assert p.take_step() == (["huge"], ["b"])             # b: from any worker that read it


def test_a_ready_item_a_worker_later_reports_failed_is_no_longer_ready_nor_counted():
    """Reports of one item can disagree (a worker evicted its copy): a failure after a read
    makes it a miss, frees its share of the budget, and a repeated read report of a ready item
    changes nothing."""
    clock = Clock()
    p, _ = prefetches({"a", "b", "c"}, clock)
    p.available(items("a", embeddings=600))
    p.take_step()
    p.reported(loaded={"a"}, failed=set())
    p.reported(loaded={"a"}, failed=set())              # again: still ready, nothing dropped
    assert p.ready("a") and p.take_step() == ([], [])
    assert p.available(items("b", embeddings=600)) is False
    assert p.take_step() == ([], [])                    # no room beside "a"
    p.reported(loaded=set(), failed={"a"})
    assert not p.ready("a") and p.available(items("a")) is True     # encoded now
    assert p.take_step() == ([], ["a"])
    assert p.available(items("b", embeddings=600)) is False
    assert p.take_step() == (["b"], [])                 # its room came back
    assert p.counters["failed"] == 0                    # it had been read: not a failed read
