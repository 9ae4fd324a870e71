"""Engines announced to the masters (soft state in the leader) for gcache-router: the registry's
rules, and a real group of three masters answering through any member."""

import pytest

from gcache.cli.local_masters import LocalMasters
from gcache.errors import InvalidRequest, MasterError
from gcache.kv import announcer_from_settings
from gcache.master.engines import MAX_ENGINES, EngineRegistry, checked
from gcache.master_client import MasterClient
from gcache.proto import master_pb2 as pb
from tests.helpers import wait_until
from tests.master.test_master_cluster import FAST, leader_index, status


class Clock:
    now_s = 0.0

    def __call__(self):
        return self.now_s


def test_an_announcement_lives_for_its_ttl_and_is_renewed_by_the_next():
    clock = Clock()
    registry = EngineRegistry(clock)
    a = checked("http://10.0.0.1:8000/", "m", "tcp://10.0.0.1:5557", 1, 10.0)
    assert a.url == "http://10.0.0.1:8000"
    registry.announce(a, 10.0)
    registry.announce(checked("http://10.0.0.1:8000", "m2", "", 0, 3.0), 3.0)
    clock.now_s = 5.0
    assert registry.live() == [a]               # one URL, two names: the second expired
    registry.announce(a, 10.0)
    clock.now_s = 14.0
    assert registry.live() == [a]
    clock.now_s = 15.0
    assert registry.live() == []


@pytest.mark.parametrize("fields, words", [
    (("10.0.0.1:8000", "m", "", 0, 5.0), "http://HOST:PORT"),
    (("http://h:99999", "m", "", 0, 5.0), "http://HOST:PORT"),
    (("http://h:1", "", "", 0, 5.0), "model is empty"),
    (("http://h:1", "m" * 600, "", 0, 5.0), "at most 512"),
    (("http://h:1", "m", "udp://h:1", 0, 5.0), "tcp://HOST:PORT or ipc://PATH"),
    (("http://h:1", "m", "", 65, 5.0), "not a length bucket"),
    (("http://h:1", "m", "", 0, 0.0), "ttl_s"),
    (("http://h:1", "m", "", 0, 3600.0), "ttl_s"),
])
def test_a_bad_announcement_is_refused_by_name(fields, words):
    with pytest.raises(InvalidRequest, match=words):
        checked(*fields)


def test_the_registry_is_bounded():
    registry = EngineRegistry(Clock())
    for i in range(MAX_ENGINES):
        registry.announce(checked(f"http://h:{i + 1}", "m", "", 0, 5.0), 5.0)
    with pytest.raises(InvalidRequest, match="no more"):
        registry.announce(checked("http://other:1", "m", "", 0, 5.0), 5.0)
    registry.announce(checked("http://h:1", "m", "", 0, 5.0), 5.0)     # a renewal still is


@pytest.fixture(scope="module")
def masters(tmp_path_factory):
    with LocalMasters(3, args=FAST, log_dir=str(tmp_path_factory.mktemp("masters"))) as group:
        wait_until(lambda: leader_index(group) is not None, timeout_s=15)
        # followers redirect to the leader once they know its gRPC address
        wait_until(lambda: all(status(a).leader_grpc for a in group.addresses), timeout_s=15)
        yield group


def test_any_member_takes_an_announcement_and_lists_it(masters):
    engine = pb.Engine(url="http://127.0.0.1:8001", model="tiny", events="ipc:///tmp/kv.sock",
                       bucket=1)
    for address in masters.addresses:        # followers redirect to the leader
        with MasterClient([address]) as link:
            link.announce_engine(engine, 30.0)
            assert list(link.engines()) == [engine]
    with MasterClient(masters.addresses) as link, pytest.raises(MasterError, match="ttl_s"):
        link.announce_engine(engine, -1.0)


def test_a_connectors_announcer_keeps_an_engine_listed_until_it_stops(masters):
    settings = {"master": ",".join(masters.addresses), "engine_url": "http://127.0.0.1:8002",
                "engine_bucket": 0}
    announcer = announcer_from_settings(settings, ["a", "b"], "tcp://*:5557", every_s=0.2,
                                        ttl_s=1.0)
    expected = {("a", "tcp://127.0.0.1:5557"), ("b", "tcp://127.0.0.1:5557")}
    with MasterClient(masters.addresses) as link:
        def listed():
            return {(e.model, e.events) for e in link.engines()
                    if e.url == "http://127.0.0.1:8002"}
        try:
            wait_until(lambda: listed() == expected, timeout_s=10)
        finally:
            announcer.close()
        wait_until(lambda: listed() == set(), timeout_s=10)     # 1 s after its last


@pytest.mark.parametrize("settings, words", [
    ({"engine_url": "http://h:1"}, "set gcache_master too"),
    ({"engine_url": "h:1", "master": "127.0.0.1:1"}, "http://HOST:PORT"),
])
def test_announcer_settings_are_checked(settings, words):
    with pytest.raises(Exception, match=words):
        announcer_from_settings(settings, ["a"], "")
    assert announcer_from_settings({}, ["a"], "") is None
