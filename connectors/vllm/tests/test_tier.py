"""``GCacheTier`` under vLLM 0.33's own tiering code: the manager an engine builds from its
``--kv-transfer-config`` (CPU primary tier, GCache secondary), driven as vLLM's offloading
scheduler drives it, against real gcache-server processes (``engine_testing.vllm_tiering``)."""

from __future__ import annotations

import os
import pathlib
import shlex
import signal
import time

import pytest
from engine_testing.vllm_tiering import (
    build_manager,
    chunk_keys,
    look_up,
    promote,
    settle,
    steps,
    store,
    tier_config,
    transfer_config,
)
from vllm.v1.kv_offload.base import LookupResult, Medium, ReqContext

from gcache.cli.local_cluster import LocalCluster
from gcache.errors import ConfigError

pytestmark = pytest.mark.timeout(180)
README = pathlib.Path(__file__).resolve().parents[3] / "docs" / "engines" / "vllm-tier.md"


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A cluster for the tests that neither kill nor stop a server."""
    with LocalCluster(2, memory="128MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path_factory.mktemp("gcache"))) as running:
        yield running


def test_stores_cascade_and_a_fresh_engine_promotes_the_same_bytes(shared, managers):
    config = transfer_config(tier_config(shared.addresses))
    first = managers(config)
    assert type(first.secondary_tiers[0]).__name__ == "GCacheTier"
    full, sliding = chunk_keys(6, seed=1), chunk_keys(3, seed=2, group=1)
    written = store(first, "a", full, seed=1)
    written |= store(first, "a-swa", sliding, seed=2)        # a sliding-window group's chunks
    settle(first)
    assert first.secondary_tiers[0].counters["stored"] == 9

    second = managers(config)                                # a fresh engine: CPU tier empty
    got = promote(second, "b", full + sliding)
    assert set(got) == set(full + sliding)
    assert all(got[key] == written[key] for key in got)
    assert second.secondary_tiers[0].counters["loaded"] == 9


def test_keys_name_the_model(shared, managers):
    keys = chunk_keys(2, seed=3)
    store(managers(transfer_config(tier_config(shared.addresses))), "a", keys, seed=3)
    other = managers(transfer_config(tier_config(shared.addresses)), model="gcache-test/other")
    ctx = ReqContext(req_id="b")
    with other.lock:
        other.on_new_request(ctx)
    assert look_up(other, ctx, keys) == [LookupResult.MISS] * 2


def test_a_server_killed_before_the_promotion_fails_only_its_keys(cluster, managers):
    config = transfer_config(tier_config(cluster.addresses, gcache_timeout_ms=1000))
    first = managers(config)
    keys = chunk_keys(12, seed=4)
    written = store(first, "a", keys, seed=4)
    settle(first)

    second = managers(config)
    tier = second.secondary_tiers[0]
    ctx = ReqContext(req_id="b")
    with second.lock:
        second.on_new_request(ctx)
    # the lookups answer HIT (promotions queued, submitted at the step's end); then a crash
    assert look_up(second, ctx, keys) == [LookupResult.HIT_PENDING] * 12
    cluster.kill(0)
    final = look_up(second, ctx, keys, waiting=(LookupResult.HIT_PENDING,))
    hits = [k for k, r in zip(keys, final) if r == LookupResult.HIT]
    assert 0 < len(hits) < len(keys)                           # two servers, twelve keys
    assert set(final) == {LookupResult.HIT, LookupResult.MISS}
    assert tier.counters["failed_loads"] == 1
    with second.lock:                                          # what landed is whole
        spec = second.prepare_load(hits, ctx)
        size = tier.block_size_bytes
        with second.primary_tier.get_kv_memoryview().cast("B") as view:
            for key, chunk in zip(hits, spec.block_ids):
                assert bytes(view[int(chunk) * size:(int(chunk) + 1) * size]) == written[key]
        second.complete_load(hits, ctx)
    # the failed keys are not promoted again: MISS for this request, no loop
    missed = [k for k, r in zip(keys, final) if r == LookupResult.MISS]
    assert look_up(second, ctx, missed) == [LookupResult.MISS] * len(missed)


def test_a_stalled_cluster_is_backpressure_not_a_stalled_step(cluster, managers):
    tier = tier_config(cluster.addresses, gcache_timeout_ms=2000,
                       backpressure={"backpressure_cls": "EMABackpressureDetector",
                                     "failure_threshold": 2})
    manager = managers(transfer_config(tier))
    gcache = manager.secondary_tiers[0]
    pids = [server.pid for server in cluster.servers]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)                           # alive but silent
    try:
        store(manager, "r0", chunk_keys(2, seed=10), seed=10)
        # the step returned with its cascade in flight: nothing waited for the silent servers
        with manager.lock:
            assert manager.has_pending_work()
        settle(manager)
        for i in (1, 2):
            store(manager, f"r{i}", chunk_keys(2, seed=10 + i), seed=10 + i)
            settle(manager)
        assert gcache.counters["failed_stores"] >= 2
        assert gcache.bp_detector.is_under_pressure()
        submitted = gcache.counters["store_jobs"]
        store(manager, "late", chunk_keys(2, seed=20), seed=20)
        assert gcache.counters["store_jobs"] == submitted       # vLLM dropped the cascade
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def test_stores_are_announced_and_withdrawn_after_their_ttl(shared, managers):
    config = transfer_config(tier_config(shared.addresses, enable_kv_events=True,
                                         event_ttl_s=0.5))
    manager = managers(config, events=True)
    keys = chunk_keys(3, seed=5)
    store(manager, "a", keys, seed=5)
    settle(manager)
    events = [e for e in manager.take_events() if e.ownership == "gcache"]
    assert [(e.removed, e.medium, e.locality.value) for e in events] == \
        [(False, Medium.CPU, "REMOTE")]
    assert set(events[0].keys) == set(keys)
    time.sleep(0.6)
    withdrawn = [e for e in manager.take_events() if e.ownership == "gcache"]
    assert [(e.removed, set(e.keys)) for e in withdrawn] == [(True, set(keys))]


def test_events_are_off_unless_asked(shared, managers):
    manager = managers(transfer_config(tier_config(shared.addresses)), events=True)
    store(manager, "a", chunk_keys(2, seed=6), seed=6)
    settle(manager)
    assert not [e for e in manager.take_events() if e.ownership == "gcache"]


@pytest.mark.parametrize("extra, named", [({"gcache_bogus": 1}, "bogus"),
                                          ({"root_dir": "/x"}, "root_dir"),
                                          ({"gcache_policy": "tail"}, "policy"),
                                          ({"job_threads": 0}, "job_threads")])
def test_a_bad_setting_stops_the_engine_at_start_naming_it(extra, named):
    with pytest.raises(ConfigError, match=named):                # before any connection
        build_manager(transfer_config(tier_config(["127.0.0.1:9"], **extra)))


def test_lookups_never_block_a_step(shared, managers):
    manager = managers(transfer_config(tier_config(shared.addresses)))
    ctx = ReqContext(req_id="a")
    with manager.lock:
        manager.on_new_request(ctx)
        assert manager.lookup(chunk_keys(1, seed=7)[0], ctx) == LookupResult.RETRY
    assert steps(manager, lambda: manager.lookup(chunk_keys(1, seed=7)[0], ctx)
                 == LookupResult.MISS) >= 1


def test_the_readme_command_builds_the_tier_vllm_reads_from_it(shared, managers):
    """The README's ``vllm serve`` line through vLLM's own argument parser; its
    ``--kv-transfer-config`` as parsed builds the manager, with the test's servers in place of
    the example's masters and token, and 2 MiB of CPU tier in place of 20 GiB."""
    from engine_testing.readme import readme_block
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    argv = shlex.split(readme_block(README, "tier-serve").replace("\\\n", " "))
    assert argv[:2] == ["vllm", "serve"]
    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser)
    parsed = parser.parse_args(["--model", argv[2], *argv[3:]]).kv_transfer_config
    extra = dict(parsed.kv_connector_extra_config)
    (tier,) = extra["secondary_tiers"]
    tier = dict(tier)
    assert tier.pop("gcache_master") and tier.pop("gcache_token")
    tier["gcache_servers"] = ",".join(shared.addresses)
    extra |= {"cpu_bytes_to_use": 1 << 21, "secondary_tiers": [tier]}
    config = {"kv_connector": parsed.kv_connector, "kv_role": parsed.kv_role,
              "kv_connector_extra_config": extra}
    first = managers(config)
    assert type(first.secondary_tiers[0]).__name__ == "GCacheTier"
    assert first.secondary_tiers[0].bp_detector is not None     # the block's backpressure
    keys = chunk_keys(4, seed=30)
    written = store(first, "a", keys, seed=30)
    settle(first)
    got = promote(managers(config), "b", keys)
    assert got == written
