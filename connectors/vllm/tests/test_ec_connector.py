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
    producer.wait_saves()
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
    first.wait_saves()
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
    consumer.wait_saves()
    assert consumer.counters["saves"] == 0
    both = connector(ec_config(model, cluster.addresses), "WORKER")
    made.append(both)
    both.save_caches(encoder_cache={"x": torch.ones(2, 64)}, mm_hash="x")
    both.wait_saves()
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
    worker.wait_saves()
    assert worker.counters["save_failures"] == 1


# ---- vLLM's V2 model runner: items read ahead ---------------------------------------------------

class V2Engine:
    """vLLM's real ``Scheduler`` with the EC connector alone, and the worker's steps as vLLM's
    V2 model runner takes them (``v1/worker/gpu/ec_connector.ActiveECConnector``: the
    connector on steps without a forward pass too). Its encoder makes a fixed tensor per item
    and counts the runs; its gather fails as vLLM's does on an item not in the encoder cache."""

    def __init__(self, tmp_path, servers, made):
        from vllm.distributed.ec_transfer import ec_transfer_state
        from vllm.v1.worker.gpu.ec_connector import ActiveECConnector

        from .harness import kv_cache_config, scheduler
        model = write_config(tmp_path / "model", window=None)
        self.config = ec_config(model, servers)
        self.config.kv_transfer_config = None
        self.sched = scheduler(self.config, kv_cache_config(
            {"num_hidden_layers": 4}, heads=2, head_dim=32))
        manager = type(self.sched.encoder_cache_manager)
        self.sched.encoder_cache_manager = manager.create_manager(cache_size=512,
                                                                  vllm_config=self.config)
        self.sched.max_num_encoder_input_tokens = 512     # the tiny text model has no encoder
        self.worker = connector(self.config, "WORKER")
        made += [self.sched.ec_connector, self.worker]
        ec_transfer_state._EC_CONNECTOR_AGENT = self.worker
        self.encoder_cache: dict[str, torch.Tensor] = {}
        self.runner = ActiveECConnector(self.config, self.encoder_cache)
        self.requests: dict[str, object] = {}
        self.encoded: list[str] = []

    def close(self):
        from vllm.distributed.ec_transfer import ec_transfer_state
        ec_transfer_state._EC_CONNECTOR_AGENT = None

    def add(self, req):
        self.requests[req.request_id] = req
        self.sched.add_request(req)

    def step(self):
        from vllm.v1.outputs import ModelRunnerOutput
        out = self.sched.schedule()
        for identifier in out.free_encoder_mm_hashes:
            self.encoder_cache.pop(identifier, None)
        if not out.total_num_scheduled_tokens:
            output = self.runner.no_forward(out)
        else:
            with self.runner.maybe_get_output(out) as ec_output:
                for req_id, inputs in out.scheduled_encoder_inputs.items():
                    for i in inputs:
                        identifier = self.requests[req_id].mm_features[i].identifier
                        self.encoder_cache[identifier] = torch.full((64, 64), 7.0)
                        self.encoded.append(identifier)
                for req_id in out.num_scheduled_tokens:
                    for feature in self.requests[req_id].mm_features:
                        if feature.identifier not in self.encoder_cache:
                            raise RuntimeError(f"Encoder cache miss for {feature.identifier}.")
            req_ids = list(out.num_scheduled_tokens)
            output = ModelRunnerOutput(req_ids=req_ids,
                                       req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                       sampled_token_ids=[[7] for _ in req_ids],
                                       ec_connector_output=ec_output)
        self.sched.update_from_output(out, output)
        return out


@pytest.fixture
def v2(monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")


def test_with_the_v2_runner_a_request_waits_while_its_item_is_read_and_skips_the_encoder(
        tmp_path, cluster, made, v2):
    engine = V2Engine(tmp_path, cluster.addresses, made)
    try:
        assert engine.sched.ec_connector.prefetches is not None
        output = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
        producer = connector(engine.config, "WORKER")
        made.append(producer)
        producer.save_caches(encoder_cache={"img-cat": output}, mm_hash="img-cat")
        producer.wait_saves()
        engine.add(image_request("b", "img-cat"))
        first = engine.step()                  # held back; the worker reads on an empty step
        assert first.total_num_scheduled_tokens == 0
        assert first.ec_connector_metadata.loads == ["img-cat"]
        assert torch.equal(engine.encoder_cache["img-cat"], output)
        second = engine.step()
        assert second.num_scheduled_tokens["b"] == 81 and not second.scheduled_encoder_inputs
        assert engine.encoded == [] and torch.equal(engine.encoder_cache["img-cat"], output)
        assert engine.worker.counters["loads"] == 1
    finally:
        engine.close()


def test_with_the_v2_runner_an_item_lost_after_the_probe_is_encoded_not_a_failed_step(
        tmp_path, made, v2):
    from gcache.cli.local_cluster import LocalCluster
    with LocalCluster(1, memory="64MiB", log_dir=str(tmp_path / "gcache")) as lost:
        engine = V2Engine(tmp_path, lost.addresses, made)
        try:
            producer = connector(engine.config, "WORKER")
            made.append(producer)
            producer.save_caches(encoder_cache={"img": torch.ones(64, 64)}, mm_hash="img")
            producer.wait_saves()
            engine.add(image_request("b", "img"))
            out = engine.sched.schedule()      # the scheduler found it and asks for it ...
            assert out.ec_connector_metadata.loads == ["img"]
            lost.kill(0)                       # ... and its server dies before the read
            engine.sched.update_from_output(out, engine.runner.no_forward(out))
            assert engine.worker.counters["load_misses"] == 1
            steps = [engine.step() for _ in range(2)]
            assert steps[0].scheduled_encoder_inputs == {"b": [0]}     # encoded instead
            assert engine.encoded == ["img"] and steps[1].num_scheduled_tokens == {"b": 1}
        finally:
            engine.close()


def test_a_save_returns_before_its_put_and_a_shutdown_puts_what_is_queued(
        tmp_path, cluster, made, monkeypatch):
    """vLLM saves on the thread that runs the forward pass: ``save_caches`` queues the output
    and returns while the put is still held up; ``shutdown`` waits for it."""
    import threading

    from gcache.mm import EncoderCache
    model = write_config(tmp_path / "model", window=None)
    config = ec_config(model, cluster.addresses)
    producer, scheduler = connector(config, "WORKER"), connector(config, "SCHEDULER")
    made.append(scheduler)
    held, put = threading.Event(), EncoderCache.put

    def slow_put(self, key, tensor):
        assert held.wait(60)
        return put(self, key, tensor)

    monkeypatch.setattr(EncoderCache, "put", slow_put)
    saving = threading.Thread(target=producer.save_caches,
                              kwargs={"encoder_cache": {"img": torch.ones(8, 64)},
                                      "mm_hash": "img"})
    saving.start()
    saving.join(30)
    assert not saving.is_alive() and producer.counters["saves"] == 0   # not put yet
    held.set()
    producer.shutdown()
    assert producer.counters["saves"] == 1 and scheduler.has_cache_item("img")
