"""vLLM's own tests of its tiering framework (vllm-project/vllm, ``tests/v1/kv_offload/tiering/``)
for what a secondary tier owes it, run against ``GCacheTier`` and real gcache-server processes.
Upstream tests each tier with stand-ins of its own; these are ours for the same behaviours,
with faults made by SIGKILL or SIGSTOP of a server.

From ``test_fs_tier.py`` (the tier alone, over memory of the test's own, which must close after
the tier's shutdown: the tier kept no view of it):
- ``test_lookup_empty_tier``, ``test_store_creates_file_and_lookup_succeeds``,
  ``test_multiple_jobs_tracked_independently``: a miss, then stores reported by job id and found
  (by a lookup: there is no file to look at). Lookups answer RETRY first: probed per step.
- ``test_store_then_load_roundtrip``, ``test_store_load_data_integrity`` (its batch sizes, 0
  too): the bytes come back whole into other chunks, and stay stored.
- ``test_failed_load_missing_file``, ``test_batched_load_first_block_fails_marks_whole_batch``:
  a load of keys never stored fails, none landed, and they miss for that request.
- ``test_multi_block_job_partial_failure``, ``test_batched_partial_load_failure_keeps_loaded_
  blocks``, ``test_failed_load_corrects_verdict_and_removes_corrupt_file``: the truncated file
  becomes a server killed after the lookups; the load reports the keys that landed, the lost
  ones miss for that request at once (no new probe, no loop) and for a fresh one.
- ``test_out_of_bounds_block_id_smoke``: a chunk id outside the CPU tier fails the job.
- ``test_wait_idle_blocks_until_tasks_complete``: ``drain_jobs``, with the server stopped.
- ``test_shutdown_discards_pending_tasks``: ours finishes the jobs rather than dropping them;
  checked: it returns with the tier's threads gone and the memory free.
- ``test_invalid_locality_raises_at_construction``, ``test_factory_forwards_locality_to_fs_tier``
  (GCache's default is REMOTE; "local" is taken in any case).
- ``test_successful_store_emits_stored_event``, ``test_load_job_emits_no_event``,
  ``test_events_require_global_kv_events_flag``, ``test_mixed_job_results_emit_event_only_for_
  successful_job`` (a stopped server fails a job). Unlike ``test_partially_failed_store_emits_
  no_event``, GCache announces the keys of a partial store that did land.

From ``test_tiering_offloading.py`` (vLLM's manager and CPU tier, ``engine_testing``):
``test_cascade_to_all_secondary_tiers``, ``test_failed_store_no_cascade``;
``test_ref_cnt_protection_during_cascade`` (chunks a cascade reads, servers stopped, are not
evicted until it is reported); ``test_eviction_in_primary_tier`` with
``test_promotion_from_secondary`` (evicted chunks come back from GCache byte for byte);
``test_failed_promotion_keeps_only_successful_blocks`` (its full failure, every server killed;
the partial case is test_tier's); ``test_lookup_batches_submit_load_per_request`` and
``test_lookup_shared_block_no_duplicate_promotion``; ``test_reset_cache_drains_all_tiers``;
``test_tier_filter_skips_filtered_secondary`` / ``..._allows_matching_secondary``.
"""

from __future__ import annotations

import threading
import uuid

import pytest
from engine_testing.vllm_tiering import (
    CHUNKS,
    Memory,
    build_spec,
    chunk_keys,
    drain,
    job,
    key,
    look_up,
    lookup_and_wait,
    promote,
    row_bytes,
    settle,
    split_by_server,
    steps,
    stopped,
    store,
    tier_config,
    transfer_config,
)
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    ReqContext,
    TierFilter,
    TierMatcher,
)
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

from gcache.cli.local_cluster import LocalCluster

pytestmark = pytest.mark.timeout(180)
HIT, MISS, RETRY, PENDING = (LookupResult.HIT, LookupResult.MISS, LookupResult.RETRY,
                             LookupResult.HIT_PENDING)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """Servers for the tests that neither kill nor stop one (each tier has its own namespace)."""
    with LocalCluster(2, memory="128MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path_factory.mktemp("gcache"))) as running:
        yield running


@pytest.fixture
def tier_on():
    """``tier_on(cluster, **settings)``: a GCacheTier over a ``Memory``, built by vLLM's
    factory from a spec of the harness's model. Shut down after the test, then its memory
    closes (the tier kept no view of it)."""
    made = []

    def make(cluster, *, events: bool = False, **settings):
        settings.setdefault("gcache_namespace", uuid.uuid4().hex)      # a cache of its own
        config = tier_config(cluster.addresses, **settings)
        spec = build_spec(transfer_config(config), events=events)
        memory = Memory()
        made.append((None, memory))
        tier = SecondaryTierFactory.create_secondary_tier(config, memory.view, spec)
        made[-1] = (tier, memory)
        return tier, memory

    yield make
    for tier, memory in made:
        if tier is not None:
            tier.shutdown()
        memory.close()


# ---- the tier alone (test_fs_tier.py) -------------------------------------------------------

def test_stores_are_reported_by_job_and_then_found(shared, tier_on):
    tier, memory = tier_on(shared)
    assert lookup_and_wait(tier, [key(1), key(2)], "before") == [MISS, MISS]
    memory.fill([0, 1], seed=1)
    tier.submit_store(job(1, [key(1)], [0]))
    tier.submit_store(job(2, [key(2)], [1]))
    results = drain(tier)
    assert {r.job_id for r in results} == {1, 2} and all(r.success for r in results)
    assert lookup_and_wait(tier, [key(1), key(2)]) == [HIT, HIT]


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_stored_bytes_load_whole_into_other_chunks_and_stay(shared, tier_on, n):
    tier, memory = tier_on(shared)
    keys = [key(i) for i in range(n)]
    written = memory.fill(range(n), seed=n)
    tier.submit_store(job(1, keys, range(n)))
    assert [r.success for r in drain(tier)] == [True]
    memory.rows[:] = 0
    targets = list(range(CHUNKS - n, CHUNKS))                 # disjoint from the stored ones
    tier.submit_load(job(2, keys, targets, promotion=True))
    assert [r.success for r in drain(tier)] == [True]
    assert [memory.rows[c].tobytes() for c in targets] == written
    assert lookup_and_wait(tier, keys) == [HIT] * n


def test_a_load_of_keys_never_stored_fails_and_they_miss(shared, tier_on):
    tier, _ = tier_on(shared)
    keys = [key(97), key(98), key(99)]
    assert lookup_and_wait(tier, keys, "r") == [MISS] * 3
    tier.submit_load(job(1, keys, [0, 1, 2], promotion=True, req="r"))
    (result,) = drain(tier)
    assert not result.success and not result.successful_keys
    assert [tier.lookup(k, ReqContext(req_id="r")) for k in keys] == [MISS] * 3


def test_a_partly_failed_load_reports_what_landed_and_misses_the_rest(cluster, tier_on):
    tier, memory = tier_on(cluster, gcache_timeout_ms=1000)
    lost, kept = split_by_server(tier, cluster, 3)
    keys = [lost[0], kept[0], lost[1], kept[1], kept[2], lost[2]]
    written = memory.fill(range(6), seed=2)
    tier.submit_store(job(1, keys, range(6)))
    assert [r.success for r in drain(tier)] == [True]
    assert lookup_and_wait(tier, keys, "r") == [HIT] * 6
    cluster.kill(0)
    memory.rows[:] = 0
    tier.submit_load(job(2, keys, range(6), promotion=True, req="r"))
    (result,) = drain(tier)
    assert not result.success and set(result.successful_keys) == set(kept)
    for i, k in enumerate(keys):
        assert (memory.rows[i].tobytes() == written[i]) == (k in kept)
    want = [HIT if k in kept else MISS for k in keys]
    assert [tier.lookup(k, ReqContext(req_id="r")) for k in keys] == want
    assert not tier.has_pending_work()                      # answered without a new probe
    assert lookup_and_wait(tier, keys, "fresh") == want


def test_a_chunk_outside_the_cpu_tier_fails_the_job(shared, tier_on):
    tier, _ = tier_on(shared)
    tier.submit_store(job(1, [key(1)], [CHUNKS]))
    tier.submit_load(job(2, [key(1)], [CHUNKS], promotion=True))
    assert sorted((r.job_id, r.success) for r in drain(tier)) == [(1, False), (2, False)]
    assert lookup_and_wait(tier, [key(1)]) == [MISS]      # nothing short was stored


def test_drain_waits_for_a_job_held_by_a_stopped_server(cluster, tier_on):
    tier, memory = tier_on(cluster, gcache_servers=cluster.addresses[0],
                           gcache_timeout_ms=60000)
    memory.fill([0], seed=3)
    with stopped(cluster, 0):
        tier.submit_store(job(1, [key(1)], [0]))
        drainer = threading.Thread(target=tier.drain_jobs)
        drainer.start()
        drainer.join(timeout=0.5)
        assert drainer.is_alive()                 # the job waits on the stopped server
    drainer.join(timeout=60)
    assert not drainer.is_alive()
    assert [r.job_id for r in tier.get_finished_jobs()] == [1]
    assert not tier.has_pending_work()


def test_shutdown_with_jobs_in_flight_leaves_no_thread_and_no_view(shared, tier_on):
    before = set(threading.enumerate())
    tier, memory = tier_on(shared)
    memory.fill(range(CHUNKS), seed=4)
    for i in range(10):
        tier.submit_store(job(i, [key(i)], [i % CHUNKS]))
    tier.shutdown()
    assert not [t.name for t in set(threading.enumerate()) - before if t.is_alive()]


@pytest.mark.parametrize("given, expected", [(None, Locality.REMOTE), ("LOCAL", Locality.LOCAL),
                                             ("local", Locality.LOCAL), ("", None),
                                             ("nearby", None)])
def test_the_factory_passes_the_locality_and_a_bad_one_stops_the_tier(shared, tier_on, given,
                                                                      expected):
    settings = {} if given is None else {"locality": given}
    if expected is None:
        with pytest.raises(ValueError, match="Locality"):
            tier_on(shared, **settings)
    else:
        assert tier_on(shared, **settings)[0].locality is expected


def test_a_store_is_announced_once_and_a_load_not_at_all(shared, tier_on):
    tier, memory = tier_on(shared, events=True, enable_kv_events=True, locality="LOCAL")
    memory.fill([0, 1], seed=5)
    tier.submit_store(job(1, [key(1), key(2)], [0, 1]))
    assert all(r.success for r in drain(tier))
    (event,) = tier.take_events()
    assert (set(event.keys), event.medium, event.locality, event.removed) == \
        ({key(1), key(2)}, Medium.CPU, Locality.LOCAL, False)
    assert list(tier.take_events()) == []                   # taken
    tier.submit_load(job(2, [key(1)], [2], promotion=True))
    assert all(r.success for r in drain(tier))
    assert list(tier.take_events()) == []


@pytest.mark.parametrize("engine_events", [False, True])
def test_events_need_both_the_tier_and_the_engine_to_ask(shared, tier_on, engine_events):
    tier, memory = tier_on(shared, events=engine_events, enable_kv_events=not engine_events)
    memory.fill([0], seed=6)
    tier.submit_store(job(1, [key(1)], [0]))
    assert all(r.success for r in drain(tier))
    assert list(tier.take_events()) == []


def test_only_keys_that_landed_are_announced(cluster, tier_on):
    tier, memory = tier_on(cluster, events=True, enable_kv_events=True, gcache_timeout_ms=500)
    lost, kept = split_by_server(tier, cluster, 2)
    memory.fill(range(6), seed=7)
    with stopped(cluster, 0):
        tier.submit_store(job(1, lost, [0, 1]))
        tier.submit_store(job(2, kept[:1], [2]))
        tier.submit_store(job(3, [lost[0], kept[1]], [3, 4]))   # a partial store
        results = {r.job_id: r.success for r in drain(tier)}
    assert results == {1: False, 2: True, 3: False}
    announced = {k for e in tier.take_events() if not e.removed for k in e.keys}
    assert announced == set(kept)


# ---- vLLM's manager with its CPU tier (test_tiering_offloading.py) --------------------------

def stored_elsewhere(managers, config: dict, keys, *, seed: int) -> dict:
    """``keys`` stored in GCache by another engine (its cascades finished); the bytes."""
    other = managers(config)
    written = store(other, "elsewhere", keys, seed=seed)
    settle(other)
    return written


def test_a_cascade_reaches_gcache_and_a_failed_cpu_store_none(shared, managers):
    manager = managers(transfer_config(tier_config(shared.addresses)))
    tier = manager.secondary_tiers[0]
    keys = chunk_keys(3, seed=40)
    store(manager, "a", keys, seed=40)
    settle(manager)
    assert lookup_and_wait(tier, keys, "probe") == [HIT] * 3
    failed, ctx = chunk_keys(2, seed=41), ReqContext(req_id="b")
    with manager.lock:
        manager.on_new_request(ctx)
        assert manager.prepare_store(failed, ctx) is not None
        manager.complete_store(failed, ctx, success=False)
    assert tier.counters["store_jobs"] == 1
    assert lookup_and_wait(tier, failed, "probe2") == [MISS] * 2


def test_chunks_a_cascade_reads_are_not_evicted_until_it_is_reported(cluster, managers):
    config = transfer_config(tier_config(cluster.addresses, gcache_timeout_ms=60000))
    probe = managers(config)
    config["kv_connector_extra_config"]["cpu_bytes_to_use"] = 4 * row_bytes(probe)
    manager = managers(config)
    more, ctx = chunk_keys(4, seed=43), ReqContext(req_id="b")
    with stopped(cluster):
        store(manager, "a", chunk_keys(4, seed=42), seed=42)   # the cascade waits
        with manager.lock:
            manager.on_new_request(ctx)
            assert manager.prepare_store(more, ctx) is None    # all four still being read
    settle(manager)
    with manager.lock:
        assert manager.prepare_store(more, ctx) is not None     # reported: evictable now
        manager.complete_store(more, ctx, success=False)


def test_chunks_the_cpu_tier_evicted_come_back_from_gcache(shared, managers):
    config = transfer_config(tier_config(shared.addresses, gcache_namespace="evicted"))
    config["kv_connector_extra_config"]["cpu_bytes_to_use"] = 4 * row_bytes(managers(config))
    manager = managers(config)
    first = chunk_keys(4, seed=44)
    written = store(manager, "a", first, seed=44)
    settle(manager)
    store(manager, "b", chunk_keys(4, seed=45), seed=45)     # evicts the first four
    settle(manager)
    assert promote(manager, "c", first) == written


def test_a_promotion_whose_servers_all_died_misses_every_key(cluster, managers):
    config = transfer_config(tier_config(cluster.addresses, gcache_timeout_ms=1000))
    keys = chunk_keys(4, seed=46)
    stored_elsewhere(managers, config, keys, seed=46)
    manager = managers(config)
    ctx = ReqContext(req_id="b")
    with manager.lock:
        manager.on_new_request(ctx)
    assert look_up(manager, ctx, keys) == [PENDING] * 4
    cluster.kill(0)
    cluster.kill(1)
    assert look_up(manager, ctx, keys, waiting=(PENDING,)) == [MISS] * 4


def test_promotions_are_one_load_per_request_and_one_per_key(shared, managers):
    config = transfer_config(tier_config(shared.addresses))
    keys = chunk_keys(5, seed=47)
    written = stored_elsewhere(managers, config, keys, seed=47)
    manager = managers(config)
    tier = manager.secondary_tiers[0]
    wanted = {"r1": keys[:3], "r2": keys[2:]}                 # keys[2] wanted by both
    contexts = {req: ReqContext(req_id=req) for req in wanted}
    with manager.lock:
        for ctx in contexts.values():
            manager.on_new_request(ctx)

    def answered() -> bool:                                   # both asked in every step
        return not {manager.lookup(k, ctx) for req, ctx in contexts.items()
                    for k in wanted[req]} & {RETRY, PENDING}
    steps(manager, answered)
    assert tier.counters["load_jobs"] == 2 and tier.counters["loaded"] == 5
    assert promote(manager, "r3", keys) == written           # all in the CPU tier now


def test_reset_cache_returns_with_no_job_of_the_tier_left(cluster, managers):
    manager = managers(transfer_config(tier_config(cluster.addresses, gcache_timeout_ms=1000)))
    tier = manager.secondary_tiers[0]
    with stopped(cluster):
        store(manager, "a", chunk_keys(3, seed=48), seed=48)
        with manager.lock:
            assert tier.has_pending_work()
            manager.reset_cache()
            assert not tier.has_pending_work() and not manager.has_pending_work()


@pytest.mark.parametrize("matcher, answer", [(TierMatcher(medium=Medium.STORAGE), MISS),
                                            (TierMatcher(medium=Medium.CPU), RETRY)])
def test_a_request_tier_filter_decides_whether_gcache_is_asked(shared, managers, matcher,
                                                               answer):
    config = transfer_config(tier_config(shared.addresses))
    keys = chunk_keys(2, seed=49)
    stored_elsewhere(managers, config, keys, seed=49)
    manager = managers(config)
    ctx = ReqContext(req_id="b", load_tier_filter=TierFilter(matchers=(matcher,)))
    with manager.lock:
        manager.on_new_request(ctx)
        assert [manager.lookup(k, ctx) for k in keys] == [answer] * 2
    final = look_up(manager, ctx, keys, waiting=(RETRY, PENDING))
    assert final == ([MISS] * 2 if answer == MISS else [HIT] * 2)
