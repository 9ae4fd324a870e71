"""Interface level: vLLM 0.33.0's real scheduler and our connector's worker side on CPU,
against a real local GCache cluster. One engine saves a prompt; a fresh scheduler and worker
find the window-safe prefix and load it, layer by layer, into other blocks."""

from __future__ import annotations

import json

import pytest
import torch

from .harness import (
    MADE,
    PAGE,
    kv_cache_config,
    kv_tensors,
    layer_name,
    request,
    scheduler,
    until_scheduled,
    vllm_config,
    write_config,
)

HEADS, HEAD_DIM = 2, 32


@pytest.fixture(scope="module", autouse=True)
def one_process_group():
    """vLLM's parallel state for this one CPU process (the worker side asks its TP rank)."""
    from .harness import init_one_process_group
    init_one_process_group()


def engine_pair(tmp_path, cluster, *, window, sliding_first=True, policy="adaptive",
                **settings):
    model = write_config(tmp_path / "model", window=window, sliding_first=sliding_first,
                         heads=HEADS, head_dim=HEAD_DIM)
    config = vllm_config(model, cluster.addresses, policy=policy, **settings)
    layout = json.loads((model / "config.json").read_text())
    return config, kv_cache_config(layout, heads=HEADS, head_dim=HEAD_DIM), layout


def worker(config, kv_config, seed):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from gcache_vllm.connector import GCacheConnector
    connector = GCacheConnector(config, KVConnectorRole.WORKER, kv_config)
    MADE.append(connector)
    names = [n for g in kv_config.kv_cache_groups for n in g.layer_names]
    tensors = kv_tensors(sorted(names), heads=HEADS, head_dim=HEAD_DIM, seed=seed)
    connector.register_kv_caches(tensors)
    return connector, tensors


def run_step(sched, connector, *, forward):
    """One scheduler step and the worker calls vLLM makes around the forward pass."""
    out = sched.schedule()
    meta = out.kv_connector_metadata
    connector.bind_connector_metadata(meta)
    connector.start_load_kv(None)
    for name in sorted(connector.worker.layers, key=lambda n: connector.worker.layers[n][0]):
        connector.wait_for_layer_load(name)
        forward(name)
        connector.save_kv_layer(name, connector.worker.layers[name][1].tensor, None)
    connector.wait_for_save()
    connector.clear_connector_metadata()
    return out, meta


def save_prompt(config, kv_config, prompt, *, seed, req_id="saver"):
    """A first engine (scheduler and worker) that computes ``prompt`` and saves it."""
    sched = scheduler(config, kv_config)
    saver, _ = worker(config, kv_config, seed=seed)
    sched.add_request(request(req_id, prompt))
    return run_step(sched, saver, forward=lambda name: None)


def same_tokens(a, a_blocks, b, b_blocks, tokens):
    return all(torch.equal(a[a_blocks[t // PAGE], :, t % PAGE], b[b_blocks[t // PAGE], :, t % PAGE])
               for t in tokens)


@pytest.mark.parametrize("window,sliding_first", [(None, True), (32, True), (32, False)])
def test_save_then_a_fresh_engine_loads_the_window_safe_prefix(tmp_path, cluster, window,
                                                               sliding_first,
                                                               as_transfer_group):
    config, kv_config, layout = engine_pair(tmp_path, cluster, window=window,
                                            sliding_first=sliding_first)
    prompt = list(range(1000, 1100))                       # 100 tokens: 6 whole pages
    first_sched = scheduler(config, kv_config)
    first_worker, source = worker(config, kv_config, seed=1)
    first_sched.add_request(request("a", prompt))
    out, meta = run_step(first_sched, first_worker, forward=lambda name: None)
    assert out.num_scheduled_tokens["a"] == 100 and not meta.loads
    assert [s.req_id for s in meta.saves] == ["a"] and len(meta.saves[0].token_ids) == 96
    counters = first_worker.worker.counters
    assert counters["saved_layers"] == 4 and counters["save_errors"] == 0
    saved_blocks = meta.saves[0].block_ids

    # a fresh engine: its scheduler asks GCache, its worker loads into other blocks
    # (whole engine steps: a hybrid model's load is asynchronous, the request parked a while)
    second_sched = scheduler(config, kv_config)
    second_worker, target = worker(config, kv_config, seed=None)
    as_transfer_group(second_worker)
    second_sched.add_request(request("b", prompt))
    loads = []
    out = until_scheduled(config, second_sched, second_worker, "b", seen=loads)
    assert out.num_scheduled_tokens["b"] == 100 - 96       # 96 tokens came from GCache
    (load,) = loads
    assert len(load.token_ids) == 96 and load.skip_tokens == 0
    assert load.asynchronous == (window is not None)       # several KV cache groups
    assert second_worker.worker.counters["loaded_layers"] == 4
    assert second_worker.get_block_ids_with_load_errors() == set()
    group_of = second_worker.worker.group_of
    for i, kind in enumerate(layout.get("layer_types") or ["full_attention"] * 4):
        name = layer_name(i)
        g = group_of[name]
        if kind == "full_attention":
            tokens = range(96)
        else:                                             # the window the engine holds
            tokens = [t for t in range(96 - window, 96) if load.block_ids[g][t // PAGE] != 0]
            assert tokens, "the sliding group holds the window's blocks"
        assert same_tokens(source[name], saved_blocks[g], target[name], load.block_ids[g],
                           tokens), f"layer {i} ({kind}) differs"


def test_a_shared_part_of_a_prefix_hits_only_at_a_window_safe_boundary(tmp_path, cluster):
    config, kv_config, _ = engine_pair(tmp_path, cluster, window=32, policy="tail")
    prompt = list(range(2000, 2100))
    save_prompt(config, kv_config, prompt, seed=2, req_id="a")
    branch = prompt[:64] + list(range(5000, 5036))        # shares 4 pages, then differs
    probe_sched = scheduler(config, kv_config)
    req = request("b", branch)
    # the 4 shared pages are stored, but the "tail" policy kept the window only at page 6
    assert probe_sched.connector.get_num_new_matched_tokens(req, 0) == (0, False)
    # with the default policy a save leaves a window tail at every page (the cluster is roomy)
    adaptive, kv_config2, _ = engine_pair(tmp_path / "adaptive", cluster, window=32)
    save_prompt(adaptive, kv_config2, list(range(3000, 3100)), seed=3, req_id="c")
    other = list(range(3000, 3064)) + list(range(7000, 7036))
    assert scheduler(adaptive, kv_config2).connector.get_num_new_matched_tokens(
        request("d", other), 0) == (64, True)            # hybrid: loaded asynchronously


def test_a_local_prefix_hit_is_not_loaded_again(tmp_path, cluster):
    config, kv_config, _ = engine_pair(tmp_path, cluster, window=None)
    prompt = list(range(4000, 4100))
    save_prompt(config, kv_config, prompt, seed=4, req_id="a")
    sched = scheduler(config, kv_config)
    assert sched.connector.get_num_new_matched_tokens(request("b", prompt), 32) == (64, False)
    assert sched.connector.get_num_new_matched_tokens(request("c", prompt), 96) == (0, False)


def test_a_server_killed_before_the_load_reports_the_blocks_for_recompute(tmp_path, cluster):
    """One KV cache group: a synchronous load, its failure reported as blocks (vLLM takes
    block ids only when they are unique: one group)."""
    config, kv_config, _ = engine_pair(tmp_path, cluster, window=None)
    prompt = list(range(6000, 6100))
    save_prompt(config, kv_config, prompt, seed=5, req_id="a")
    sched = scheduler(config, kv_config)
    sched.add_request(request("b", prompt))
    out = sched.schedule()                               # matched while both servers lived
    (load,) = out.kv_connector_metadata.loads
    cluster.kill(0)
    second_worker, _ = worker(config, kv_config, seed=None)
    second_worker.bind_connector_metadata(out.kv_connector_metadata)
    second_worker.start_load_kv(None)
    for i in range(4):
        second_worker.wait_for_layer_load(layer_name(i))  # never raises, never hangs
    errors = second_worker.get_block_ids_with_load_errors()
    assert errors and 0 not in errors
    assert errors <= {b for group in load.block_ids for b in group}
    assert second_worker.get_block_ids_with_load_errors() == set()   # reported once
    # and a new request now matches only what the live server holds
    assert scheduler(config, kv_config).connector.get_num_new_matched_tokens(
        request("c", prompt), 0)[0] < 96


def test_tensor_parallel_ranks_use_their_own_keys(tmp_path, cluster):
    from gcache_vllm.model_layout import model_layout
    config, _, _ = engine_pair(tmp_path, cluster, window=32)
    config.parallel_config.tensor_parallel_size = 2
    rank0, rank1 = model_layout(config, 0), model_layout(config, 1)
    assert rank0.fingerprint() != rank1.fingerprint()
    assert rank0.layer_bytes_per_token(1) == HEADS // 2 * 2 * HEAD_DIM * 4


def test_bad_settings_stop_the_engine_at_start_naming_the_key(tmp_path, cluster):
    from gcache.errors import ConfigError
    config, kv_config, _ = engine_pair(tmp_path, cluster, window=None)
    config.kv_transfer_config.kv_connector_extra_config["gcache_polcy"] = "tail"
    with pytest.raises(ConfigError, match="gcache_polcy"):
        scheduler(config, kv_config)
    for key, bad in (("gcache_pinned_mb", 0), ("gcache_async_load_tokens", -1),
                     ("gcache_name", "a model loader setting, not the connector's")):
        config, kv_config, _ = engine_pair(tmp_path / key, cluster, window=None)
        config.kv_transfer_config.kv_connector_extra_config[key] = bad
        with pytest.raises(ConfigError, match=key):
            scheduler(config, kv_config)


def test_the_pinned_staging_cap_is_the_operators(tmp_path, cluster):
    config, kv_config, _ = engine_pair(tmp_path, cluster, window=None, pinned_mb=64)
    connector, _ = worker(config, kv_config, seed=None)
    assert connector.worker.transfers.pool.cap_bytes == 64 << 20


def test_stats_reach_vllms_own_kv_transfer_metrics_line(tmp_path, cluster):
    """The scheduler's and the workers' figures, through vLLM's own collection: the connector
    class vLLM resolves from the config builds the stats, aggregates them and logs them."""
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging
    config, kv_config, _ = engine_pair(tmp_path, cluster, window=None)
    prompt = list(range(8000, 8100))
    _, _meta = save_prompt(config, kv_config, prompt, seed=6, req_id="a")
    sched = scheduler(config, kv_config)
    loader, _ = worker(config, kv_config, seed=None)
    sched.add_request(request("b", prompt))
    run_step(sched, loader, forward=lambda name: None)
    logging = KVConnectorLogging(config.kv_transfer_config)
    for side in (sched.connector, loader):
        stats = side.get_kv_connector_stats()
        assert stats is not None and not stats.is_empty()
        logging.observe(stats.to_dict())                 # as vLLM passes it across processes
    lines = []
    logging.log(log_fn=lambda fmt, text: lines.append(text))
    figures = dict(item.split("=") for item in lines[0].split(", "))
    assert figures["lookups"] == "1" and figures["hit_tokens"] == "96", figures
    assert figures["loaded_layers"] == "4" and int(figures["bytes_loaded"]) > 0, figures
    assert float(figures["load_wait_max_ms"]) >= 0 and "failed_layers" not in figures
    assert loader.get_kv_connector_stats() is None         # nothing new since


@pytest.mark.parametrize("rate, loads", [(10 ** 12, False), (1, True)])
def test_a_hit_slower_to_load_than_to_compute_is_computed(tmp_path, cluster, rate, loads):
    """``gcache_recompute_tokens_per_s``: once the workers have reported a measured load (as
    vLLM passes their stats to the scheduler's connector), a hit whose load would take longer
    than the engine computes its tokens is recomputed, counted and logged; with a slow enough
    prefill it still loads."""
    from vllm.v1.outputs import KVConnectorOutput
    config, kv_config, _ = engine_pair(tmp_path, cluster, window=None,
                                       recompute_tokens_per_s=rate)
    start = 11000 if loads else 13000                          # each case its own prompts
    first, second = list(range(start, start + 100)), list(range(start + 500, start + 600))
    save_prompt(config, kv_config, first, seed=8, req_id="a")
    save_prompt(config, kv_config, second, seed=9, req_id="b")
    sched = scheduler(config, kv_config)
    loader, _ = worker(config, kv_config, seed=None)
    sched.add_request(request("c", first))
    out, _ = run_step(sched, loader, forward=lambda name: None)
    assert out.num_scheduled_tokens["c"] == 4                 # nothing measured yet: loaded
    stats = loader.get_kv_connector_stats()
    assert stats is not None and len(stats.data["load_times"]) == 1
    sched.connector.update_connector_output(KVConnectorOutput(kv_connector_stats=stats))
    sched.add_request(request("d", second))
    out, _ = run_step(sched, loader, forward=lambda name: None)
    assert out.num_scheduled_tokens["d"] == (4 if loads else 100)
    assert sched.connector.scheduler.counters["skipped_slow_loads"] == (0 if loads else 1)
