"""The worker side driven in the order vLLM's model runner really uses: its own
``KVConnectorModelRunnerMixin._get_kv_connector_output`` around our stand-in for the forward
pass (each attention layer's ``wait_for_layer_load`` and ``save_kv_layer``), with our connector
as vLLM's KV transfer group.

On a step without a synchronous load vLLM 0.32 and 0.33 call ``start_load_kv`` *after* the
forward pass, so the layer hooks of that step run before it. A load must apply only in the step
whose metadata carries it: the previous step's load must not be scattered again into blocks vLLM
has since reused, nor its failures reported a second time.
"""

from __future__ import annotations

import pytest
import torch

from .harness import forward, request, scheduler
from .test_scheduler_and_worker import engine_pair, save_prompt, worker

MARK = 7.0


@pytest.fixture(scope="module", autouse=True)
def one_process_group():
    from .harness import init_one_process_group
    init_one_process_group()


def runner_step(config, sched, connector, *, between=None):
    """One step as vLLM's GPU/CPU model runner makes it; ``between`` runs after the layer
    hooks, inside the forward."""
    out = sched.schedule()
    return out, forward(config, out, connector, between=between)


def loaded_blocks(meta) -> set[int]:
    return {b for load in meta.loads for group in load.block_ids for b in group if b}


def loading_engine(tmp_path, cluster, as_transfer_group, *, first_token: int, seed: int):
    """A prompt saved by one engine, and a fresh engine (vLLM's scheduler, our worker as the
    transfer group) with a request for it queued: its first step loads the prefix."""
    config, kv_config, _ = engine_pair(tmp_path, cluster, window=None)   # a sync load
    prompt = list(range(first_token, first_token + 100))
    save_prompt(config, kv_config, prompt, seed=seed, req_id="a")
    sched = scheduler(config, kv_config)
    connector, tensors = worker(config, kv_config, seed=None)
    as_transfer_group(connector)
    sched.add_request(request("b", prompt))
    return config, sched, connector, tensors


def test_a_steps_load_is_not_applied_again_in_the_next_step(tmp_path, cluster,
                                                            as_transfer_group):
    config, sched, connector, tensors = loading_engine(tmp_path, cluster, as_transfer_group,
                                                       first_token=8000, seed=6)
    first, output = runner_step(config, sched, connector)
    assert first.has_sync_kv_loads and first.kv_connector_metadata.loads
    assert connector.worker.counters["loaded_layers"] == 4 and not output.invalid_block_ids
    reused = loaded_blocks(first.kv_connector_metadata)
    for tensor in tensors.values():                       # vLLM hands the blocks to others
        tensor[sorted(reused)] = MARK
    sched.add_request(request("c", list(range(9000, 9040))))   # nothing stored for it
    second, output = runner_step(config, sched, connector)
    assert not second.has_sync_kv_loads and not second.kv_connector_metadata.loads
    assert connector.worker.counters["loaded_layers"] == 4       # nothing applied again
    for name, tensor in tensors.items():
        assert torch.all(tensor[sorted(reused)] == MARK), f"{name}: old load written again"
    assert not output.invalid_block_ids


def test_a_failed_load_is_reported_in_its_own_step_only(tmp_path, cluster, as_transfer_group):
    config, sched, connector, _ = loading_engine(tmp_path, cluster, as_transfer_group,
                                                 first_token=10000, seed=7)
    killed = []
    original_start = connector.start_load_kv

    def start_after_a_kill(forward_context, **kwargs):
        if not killed:                                    # matched while both servers lived
            cluster.kill(0)
            killed.append(True)
        original_start(forward_context, **kwargs)

    connector.start_load_kv = start_after_a_kill
    first, output = runner_step(config, sched, connector)
    assert first.kv_connector_metadata.loads and output.invalid_block_ids
    assert output.invalid_block_ids <= loaded_blocks(first.kv_connector_metadata)
    sched.add_request(request("c", list(range(11000, 11040))))
    _, output = runner_step(config, sched, connector)
    assert not output.invalid_block_ids                  # reported once, in its step

