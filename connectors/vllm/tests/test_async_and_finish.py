"""Asynchronous loads and saves at finish, through whole engine steps: vLLM 0.33's real
scheduler (``schedule`` and ``update_from_output``), its model runner's connector calls
(``_get_kv_connector_output``, or ``kv_connector_no_forward`` on a step with nothing to
compute) and our connector on both sides, against a real local GCache cluster.

An asynchronous load parks the request (``WAITING_FOR_REMOTE_KVS``) until the worker reports it
through ``get_finished``; a finished request's prompt and answer are saved before vLLM frees its
blocks, and the next turn of the conversation hits through the answer.
"""

from __future__ import annotations

import time

import pytest

from .harness import PAGE, engine_step, layer_name, request, scheduler, until_scheduled
from .test_scheduler_and_worker import engine_pair, same_tokens, worker


@pytest.fixture(scope="module", autouse=True)
def one_process_group():
    from .harness import init_one_process_group
    init_one_process_group()


def saved_engine(tmp_path, cluster, as_transfer_group, prompt, *, window=32, **settings):
    """An engine that computed and saved ``prompt``: its config, worker tensors and the save's
    blocks."""
    config, kv_config, layout = engine_pair(tmp_path, cluster, window=window, **settings)
    sched = scheduler(config, kv_config)
    connector, tensors = worker(config, kv_config, seed=8)
    as_transfer_group(connector)
    sched.add_request(request("a", prompt))
    out = engine_step(config, sched, connector)
    (save,) = out.kv_connector_metadata.saves
    return config, kv_config, layout, tensors, save.block_ids


def test_an_async_load_parks_the_request_until_the_worker_reports_it(tmp_path, cluster,
                                                                     as_transfer_group):
    prompt = list(range(12000, 12100))
    config, kv_config, layout, source, saved = saved_engine(
        tmp_path, cluster, as_transfer_group, prompt, async_load_tokens=0)
    sched = scheduler(config, kv_config)
    connector, target = worker(config, kv_config, seed=None)
    as_transfer_group(connector)
    sched.add_request(request("b", prompt))
    first = engine_step(config, sched, connector)
    (load,) = first.kv_connector_metadata.loads
    assert load.asynchronous and len(load.token_ids) == 96
    assert "b" not in first.num_scheduled_tokens           # parked while its KV arrives
    out = until_scheduled(config, sched, connector, "b")
    assert out.num_scheduled_tokens["b"] == 100 - 96        # only the last page is computed
    assert connector.worker.counters["async_loads"] == 1
    assert connector.worker.counters["loaded_layers"] == 4
    group_of = connector.worker.group_of
    for i, kind in enumerate(layout["layer_types"]):
        name, g = layer_name(i), group_of[layer_name(i)]
        tokens = range(96) if kind == "full_attention" else \
            [t for t in range(96 - 32, 96) if load.block_ids[g][t // PAGE] != 0]
        assert same_tokens(source[name], saved[g], target[name], load.block_ids[g], tokens)


def test_an_async_load_from_a_killed_server_is_recomputed(tmp_path, cluster, as_transfer_group):
    prompt = list(range(15000, 15100))
    config, kv_config, _, _, _ = saved_engine(tmp_path, cluster, as_transfer_group, prompt,
                                              async_load_tokens=0)
    sched = scheduler(config, kv_config)
    connector, _ = worker(config, kv_config, seed=None)
    as_transfer_group(connector)
    original_start = connector.start_load_kv

    def start_after_a_kill(forward_context, **kwargs):
        if cluster.servers[0].is_running():              # matched while both servers lived
            cluster.kill(0)
        original_start(forward_context, **kwargs)

    connector.start_load_kv = start_after_a_kill
    sched.add_request(request("b", prompt))
    first = engine_step(config, sched, connector)
    assert first.kv_connector_metadata.loads[0].asynchronous
    out = until_scheduled(config, sched, connector, "b")
    # two KV cache groups: the failure is the request's (failed_recving), computed in full
    assert out.num_scheduled_tokens["b"] == 100
    assert connector.worker.counters["failed_layers"] > 0


def test_a_finished_requests_answer_is_saved_and_the_next_turn_hits_through_it(
        tmp_path, cluster, as_transfer_group):
    config, kv_config, _ = engine_pair(tmp_path, cluster, window=32)
    sched = scheduler(config, kv_config)
    connector, _ = worker(config, kv_config, seed=9)
    as_transfer_group(connector)
    prompt = list(range(13000, 13100))
    sched.add_request(request("a", prompt, max_tokens=40))
    for step in range(40):                                 # the prefill and 39 decode steps
        out = engine_step(config, sched, connector, token=500 + step)
    assert "a" in sched.requests and sched.requests["a"].is_finished()   # blocks kept
    answer = list(sched.requests["a"].output_token_ids)
    assert len(answer) == 40 and not out.kv_connector_metadata.saves_at_finish

    turn2 = prompt + answer + list(range(14000, 14020))     # 160 tokens
    sched.add_request(request("b", turn2))
    out = engine_step(config, sched, connector)             # carries the finish save
    (save,) = out.kv_connector_metadata.saves_at_finish
    computed = 100 + 40 - 1                                 # the last answer token has no KV
    assert save.req_id == "a" and len(save.token_ids) == computed // PAGE * PAGE == 128
    assert "b" not in out.num_scheduled_tokens             # held behind the save
    assert "a" not in sched.requests                       # freed once the worker reported
    fresh = scheduler(config, kv_config).connector         # another engine sees it too
    assert fresh.get_num_new_matched_tokens(request("c", turn2), 0) == (128, True)
    out = until_scheduled(config, sched, connector, "b")
    assert out.num_scheduled_tokens["b"] == len(turn2) - 128   # hit through the answer


def test_a_probe_slower_than_one_io_timeout_is_a_miss(tmp_path, cluster):
    config, kv_config, _ = engine_pair(tmp_path, cluster, window=None, timeout_ms=300)
    connector = scheduler(config, kv_config).connector
    side = connector.scheduler
    assert side.probe_timeout_s == 0.3
    slow = side.store.match

    def stalled(tokens):
        time.sleep(10 * side.probe_timeout_s)
        return slow(tokens)

    side.store.match = stalled
    started = time.monotonic()
    assert connector.get_num_new_matched_tokens(request("d", list(range(100))), 0) == (0, False)
    assert time.monotonic() - started < 5 * side.probe_timeout_s   # not the stall's 10
    assert side.counters["lookup_timeouts"] == 1


def test_a_preempted_request_matched_again_on_its_way_back_gets_its_load(tmp_path, cluster,
                                                                         as_transfer_group):
    """vLLM's scheduler sends a resumed request among the cached ones (``resumed_req_ids``,
    with a new block table), not the new ones; the load it was matched for on its way back
    must go with it, or vLLM counts unwritten blocks as computed."""
    from types import SimpleNamespace
    prompt = list(range(16000, 16100))
    config, kv_config, _, _, _ = saved_engine(tmp_path, cluster, as_transfer_group, prompt,
                                              window=None)     # one group: a sync load
    side = scheduler(config, kv_config).connector.scheduler
    new = SimpleNamespace(req_id="r", prompt_token_ids=prompt, mm_features=[],
                          block_ids=([1, 2, 3, 4, 5, 6, 7],), num_computed_tokens=0)
    first = SimpleNamespace(scheduled_new_reqs=[new], num_scheduled_tokens={"r": 100},
                            scheduled_cached_reqs=SimpleNamespace(
                                req_ids=[], new_block_ids=[], num_computed_tokens=[],
                                resumed_req_ids=set()))
    side.build_meta(first)                                  # computed, then preempted
    req = request("r", prompt)
    assert side.matched_tokens(req, 0) == (96, False)
    side.after_alloc(req, None, 96)
    table = ([9, 10, 11, 12, 13, 14, 15],)
    back = SimpleNamespace(scheduled_new_reqs=[], num_scheduled_tokens={"r": 4},
                           scheduled_cached_reqs=SimpleNamespace(
                               req_ids=["r"], new_block_ids=[table], num_computed_tokens=[96],
                               resumed_req_ids={"r"}))
    meta = side.build_meta(back)
    loads = [load for load in meta.loads if load.req_id == "r"]
    assert len(loads) == 1 and len(loads[0].token_ids) == 96 and not loads[0].asynchronous
    assert loads[0].block_ids == tuple(list(g) for g in table) and loads[0].skip_tokens == 0


def image(identifier: str, offset: int, length: int):
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    return MultiModalFeatureSpec(data=None, modality="image", identifier=identifier,
                                 mm_position=PlaceholderRange(offset=offset, length=length))


def test_kv_keys_tell_images_apart_where_the_tokens_are_the_same(tmp_path, cluster,
                                                               as_transfer_group):
    """A multimodal prompt's image positions all hold one placeholder id; the connector keys
    them by the image's hash (``gcache_vllm.media``). Text-only KV saved for these very ids
    is found by a text request, and by an image request only up to the image."""
    from types import SimpleNamespace

    from gcache_vllm.media import key_tokens
    prompt = list(range(17000, 17032)) + [15] * 32 + list(range(17100, 17136))   # 100 tokens
    config, kv_config, _, _, _ = saved_engine(tmp_path, cluster, as_transfer_group, prompt,
                                              window=None)
    side = scheduler(config, kv_config).connector.scheduler
    assert side.matched_tokens(request("plain", prompt), 0)[0] == 96
    with_image = request("cat", prompt)
    with_image.mm_features = [image("sha256:cat", 32, 32)]
    assert side.matched_tokens(with_image, 0)[0] == 32        # the text before the image
    new = SimpleNamespace(req_id="cat", prompt_token_ids=prompt, num_computed_tokens=0,
                          mm_features=with_image.mm_features, block_ids=([1, 2, 3, 4, 5, 6, 7],))
    step = SimpleNamespace(scheduled_new_reqs=[new], num_scheduled_tokens={"cat": 100},
                           scheduled_cached_reqs=SimpleNamespace(
                               req_ids=[], new_block_ids=[], num_computed_tokens=[],
                               resumed_req_ids=set()))
    (save,) = side.build_meta(step).saves                    # what the workers key it by
    assert save.token_ids == key_tokens(prompt[:96], with_image.mm_features)
    assert save.token_ids[:32] == prompt[:32] and save.token_ids[64:] == prompt[64:96]
    assert min(save.token_ids[32:64]) >= 1 << 62
    assert key_tokens(prompt, [image("sha256:dog", 32, 32)])[32:64] != save.token_ids[32:64]
