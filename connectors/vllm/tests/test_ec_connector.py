"""Interface level: ``GCacheECConnector`` driven in vLLM's order (scheduler: ``has_cache_item``,
``update_state_after_alloc``, ``build_connector_meta``; worker: bind, ``start_load_caches``,
``save_caches``), against a real local GCache cluster. One engine's worker saves an encoder
output; another engine's scheduler finds it and its worker reads it into its encoder cache."""

from __future__ import annotations

import pytest
import torch

from .harness import request, write_config

PAD = 32000


def ec_config(model, servers, *, role="ec_both", **settings):
    from vllm.config import ECTransferConfig

    from .harness import vllm_config
    config = vllm_config(model, servers)
    config.ec_transfer_config = ECTransferConfig(
        ec_connector="GCacheECConnector", ec_role=role,
        ec_connector_module_path="gcache_vllm.ec_connector",
        ec_connector_extra_config={"gcache_servers": ",".join(servers),
                                   "gcache_timeout_ms": 5000,
                                   **{f"gcache_{k}": v for k, v in settings.items()}})
    return config


def connector(config, role):
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
    from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
    made = ECConnectorFactory.create_connector(
        config=config, role=getattr(ECConnectorRole, role))
    return made


def image_request(req_id: str, identifier: str):
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    req = request(req_id, list(range(100, 116)) + [PAD] * 64 + [7])
    req.mm_features = [MultiModalFeatureSpec(data=None, modality="image", identifier=identifier,
                                             mm_position=PlaceholderRange(offset=16, length=64))]
    return req


@pytest.fixture
def made():
    out = []
    yield out
    for c in out:
        c.shutdown()


def test_an_output_saved_by_one_engine_is_loaded_by_another_instead_of_encoded(
        tmp_path, cluster, made):
    model = write_config(tmp_path / "model", window=None)
    config = ec_config(model, cluster.addresses)
    producer = connector(config, "WORKER")
    scheduler, consumer = connector(config, "SCHEDULER"), connector(config, "WORKER")
    made += [producer, scheduler, consumer]
    output = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
    assert not scheduler.has_cache_item("img-cat")
    producer.save_caches(encoder_cache={"img-cat": output}, mm_hash="img-cat")
    assert producer.counters["saves"] == 1

    req = image_request("b", "img-cat")
    scheduler.build_connector_meta(None)           # a step ends: its answers are forgotten
    assert scheduler.has_cache_item("img-cat")     # asked while scheduling the step
    scheduler.update_state_after_alloc(req, 0)
    meta = scheduler.build_connector_meta(None)
    assert meta.loads == ["img-cat"]
    consumer.bind_connector_metadata(meta)
    cache: dict[str, torch.Tensor] = {}
    consumer.start_load_caches(cache)
    consumer.clear_connector_metadata()
    assert torch.equal(cache["img-cat"], output)
    assert consumer.counters["loads"] == 1


def test_a_changed_preprocessing_setting_or_weights_is_a_miss(tmp_path, cluster, made):
    model = write_config(tmp_path / "model", window=None)
    first = connector(ec_config(model, cluster.addresses), "WORKER")
    made.append(first)
    first.save_caches(encoder_cache={"img": torch.ones(4, 64)}, mm_hash="img")
    other = ec_config(model, cluster.addresses)
    other.model_config.multimodal_config = type(
        "Settings", (), {"mm_processor_kwargs": {"max_pixels": 1024}})()
    changed = connector(other, "SCHEDULER")
    tenant = connector(ec_config(model, cluster.addresses, namespace="tenant-2"), "SCHEDULER")
    same = connector(ec_config(model, cluster.addresses), "SCHEDULER")
    made += [changed, tenant, same]
    assert same.has_cache_item("img")
    assert not changed.has_cache_item("img") and not tenant.has_cache_item("img")


def test_a_producer_only_engine_does_not_load_and_a_consumer_only_does_not_save(
        tmp_path, cluster, made):
    model = write_config(tmp_path / "model", window=None)
    consumer = connector(ec_config(model, cluster.addresses, role="ec_consumer"), "WORKER")
    producer = connector(ec_config(model, cluster.addresses, role="ec_producer"), "SCHEDULER")
    made += [consumer, producer]
    consumer.save_caches(encoder_cache={"x": torch.ones(2, 64)}, mm_hash="x")
    assert consumer.counters["saves"] == 0
    both = connector(ec_config(model, cluster.addresses), "WORKER")
    made.append(both)
    both.save_caches(encoder_cache={"x": torch.ones(2, 64)}, mm_hash="x")
    assert both.counters["saves"] == 1
    assert not producer.has_cache_item("x")     # it would skip the encoder, and never load
    producer.update_state_after_alloc(image_request("r", "x"), 0)
    assert producer.build_connector_meta(None).loads == []


def test_a_dead_cluster_is_a_miss_not_an_exception(tmp_path, made):
    model = write_config(tmp_path / "model", window=None)
    config = ec_config(model, ["127.0.0.1:9"], timeout_ms=200)
    scheduler, worker = connector(config, "SCHEDULER"), connector(config, "WORKER")
    made += [scheduler, worker]
    assert scheduler.has_cache_item("img") is False
    worker.save_caches(encoder_cache={"img": torch.ones(2, 64)}, mm_hash="img")
    assert worker.counters["save_failures"] == 1
