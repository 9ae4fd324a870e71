"""The router's instances from the engines announced to the masters: who joins, who leaves."""

import pytest

from gcache.proto import master_pb2 as pb
from gcache.router.config import RouterConfig
from gcache.router.gcache_hits import GCacheHits
from gcache.router.proxy import Router


def engine(port, model="tiny", bucket=0, events=""):
    return pb.Engine(url=f"http://10.0.0.{port % 250}:{port}", model=model, bucket=bucket,
                     events=events)


@pytest.fixture
def router():
    config = RouterConfig(models=("tiny=/tok", "other=/tok2"), master=("127.0.0.1:1",),
                          instances=("http://10.0.0.5:5",), buckets=("100", "200"))
    made = Router(config, GCacheHits(None))
    yield made
    made.close()


def names(router):
    return sorted(i.name for i in router.instances)


def test_announced_engines_join_for_their_models_and_leave_when_no_longer_announced(router):
    gone = router._apply_announced([engine(1), engine(1, "other"), engine(2, bucket=1),
                                    engine(3, "not-ours"), engine(4, bucket=2), engine(5)])
    assert gone == []
    # engine 3 serves no model of this router, engine 4 a bucket it lacks, engine 5 is
    # configured (the configuration wins)
    assert names(router) == ["10.0.0.1:1", "10.0.0.2:2", "10.0.0.5:5"]
    assert router.by_name["10.0.0.1:1"].models == {"tiny", "other"}
    assert router.by_name["10.0.0.5:5"].models is None          # configured: every model
    assert not router.by_name["10.0.0.2:2"].serves("other")
    gone = router._apply_announced([engine(1), engine(2, bucket=0)])
    assert [g.name for g in gone] == ["10.0.0.2:2"]                # its bucket changed
    assert router.by_name["10.0.0.1:1"].models == {"tiny"}
    assert names(router) == ["10.0.0.1:1", "10.0.0.2:2", "10.0.0.5:5"]
    assert router.by_name["10.0.0.2:2"].spec.bucket == 0
    gone = router._apply_announced([])
    assert sorted(g.name for g in gone) == ["10.0.0.1:1", "10.0.0.2:2"]
    assert names(router) == ["10.0.0.5:5"]


def test_masters_alone_are_enough_to_configure_a_router():
    config = RouterConfig(models=("tiny=/tok",), master=("127.0.0.1:1",))
    assert config.instance_specs() == []
