"""KVStore on a real local cluster: byte-exact save and load of only what the rules keep,
window-safe matches, layer-by-layer completion, and the storage-size target."""


import numpy as np
import pytest

from gcache.errors import InvalidRequest
from gcache.kv import KVStore, LayerArrays, ModelLayout, page_keys, tail_span
from gcache.kv.policy import Pressure
from gcache.sdk import Client
from gcache.sdk.fill import Fill
from tests.kv.layouts import all_sliding, full_attention, hybrid


@pytest.fixture(scope="module")
def kv_client(shared_cluster):
    with Client(shared_cluster.addresses, timeout_s=2.0) as client:
        yield client


def kv_arrays(layout: ModelLayout, n_tokens: int, seed: int = 0) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {layer: rng.integers(1, 256, (n_tokens, layout.layer_bytes_per_token(layer)),
                                dtype=np.uint8) for layer in range(layout.num_layers)}


def tokens_of(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 50_000, n)


def expected_after_load(layout: ModelLayout, src: dict, hit: int) -> dict[int, np.ndarray]:
    """What a load of ``hit`` tokens must leave in zeroed buffers: paged layers every token,
    SWA layers the window tail only."""
    out = {layer: np.zeros_like(a) for layer, a in src.items()}
    for layer, a in src.items():
        start, stop = tail_span(hit // layout.page_size, layout.page_size, layout.window) \
            if layout.is_swa(layer) else (0, hit)
        out[layer][start:stop] = a[start:stop]
    return out


@pytest.mark.parametrize("layout", [
    hybrid(window=128, page=64, model="rt-a"),
    hybrid(window=100, page=48, model="rt-b"),          # W not a multiple of P
    hybrid(window=512, page=64, model="rt-c"),          # the tail spans eight pages
    hybrid(window=16, page=64, model="rt-d"),           # W smaller than a page
    full_attention(model="rt-e"),
    all_sliding(model="rt-f"),
], ids=lambda layout: layout.model)
def test_save_then_load_moves_exactly_the_masked_kv(kv_client, layout):
    n = 10 * layout.page_size + 7                         # a partial page is never stored
    tokens, src = tokens_of(n, 1), kv_arrays(layout, n)
    with KVStore(kv_client, layout, policy="tail") as store:
        assert store.match(tokens) == 0
        saved = store.save(tokens, LayerArrays(layout, src))
        assert saved.objects_failed == 0
        hit = store.match(tokens)
        assert hit == 10 * layout.page_size
        out = {layer: np.zeros_like(a) for layer, a in src.items()}
        handle = store.load(tokens, hit, LayerArrays(layout, out))
        assert handle.wait(timeout_s=10) and handle.failed_layers == []
    expected = expected_after_load(layout, src, hit)
    for layer in src:
        assert np.array_equal(out[layer], expected[layer]), f"layer {layer}"


def test_bytes_written_are_the_window_tail_rule(kv_client):
    layout = hybrid(window=100, page=48, model="bytes")
    n_pages = 9
    tokens = tokens_of(n_pages * 48, 2)
    with KVStore(kv_client, layout, policy="tail") as store:
        saved = store.save(tokens, LayerArrays(layout, kv_arrays(layout, n_pages * 48)))
    full, swa = len(layout.full_layers), len(layout.swa_layers)
    assert saved.bytes_written == (full * layout.full.bytes_per_token * n_pages * 48
                                   + swa * layout.swa.bytes_per_token * 100)
    assert saved.objects_written == full * n_pages + swa


@pytest.mark.parametrize("n_tokens", [32 * 1024, 128 * 1024])
def test_mimo_pro_storage_per_sequence_meets_the_formula(kv_client, n_tokens):
    """(F·b_F·N + S·b_S·W) / (F·b_F·N + S·b_S·N) of full-layer size, within 1%; on the real
    layout scaled by 512 (ratios kept), measured by what the servers took."""
    layout = ModelLayout.from_config("mimo-v2.5-pro", page_size=64).scaled(512)
    before = sum(s["tier"]["bytes"] for s in kv_client.server_stats().values())
    zeros = np.zeros((n_tokens, 10), dtype=np.uint8)
    source = LayerArrays(layout, {layer: zeros[:, :layout.layer_bytes_per_token(layer)]
                                  .copy() for layer in range(layout.num_layers)})
    with KVStore(kv_client, layout, policy="tail") as store:
        saved = store.save(tokens_of(n_tokens, n_tokens), source)
    stored = sum(s["tier"]["bytes"] for s in kv_client.server_stats().values()) - before
    F, S, W, N = 10, 60, 128, n_tokens
    b_f, b_s = layout.full.bytes_per_token, layout.swa.bytes_per_token
    full_layer_size = (F * b_f + S * b_s) * N
    target = (F * b_f * N + S * b_s * W) / (F * b_f * N + S * b_s * N) * full_layer_size
    assert saved.objects_failed == 0
    assert abs(stored - target) <= 0.01 * target, (stored, target)
    assert abs(saved.bytes_written - target) <= 0.01 * target


def test_a_shared_part_of_a_prefix_hits_only_at_a_stored_tail(kv_client):
    a = tokens_of(12 * 64, 3)
    b = np.concatenate([a[:6 * 64 + 10], tokens_of(6 * 64, 4)])   # shares 6 pages and a bit
    for policy, hit in (("checkpoint-4", 4), ("tail", 0)):
        layout = hybrid(model=f"partial-{policy}")
        with KVStore(kv_client, layout, policy=policy) as store:
            store.save(a, LayerArrays(layout, kv_arrays(layout, len(a))))
            probe = store.probe(b)
            assert probe.shared_pages == 6      # the pages are there...
            assert probe.hit_pages == hit       # ...but the window is intact only at a tail


def test_deleting_a_tail_moves_the_match_back_to_the_previous_safe_boundary(kv_client):
    layout = hybrid(model="del-tail")
    tokens = tokens_of(8 * 64, 5)
    with KVStore(kv_client, layout, policy="checkpoint-3") as store:
        store.save(tokens, LayerArrays(layout, kv_arrays(layout, len(tokens))))
        hashes = store.hashes(tokens)
        assert store.match(tokens) == 8 * 64
        key = page_keys.tail_key(hashes[7], layout.swa_layers[-1])
        assert kv_client.delete(key, group=store.key_groups(hashes, [key])[0])
        assert store.match(tokens) == 6 * 64        # one layer of the tail is enough to lose it
        key = page_keys.page_key(hashes[4], layout.full_layers[1])
        assert kv_client.delete(key, group=store.key_groups(hashes, [key])[0])
        assert store.match(tokens) == 3 * 64        # a page gone in the middle: before it


def test_load_completes_layer_by_layer_and_reports_a_lost_layer(kv_client):
    layout = hybrid(model="lost-layer")
    tokens = tokens_of(5 * 64, 6)
    src = kv_arrays(layout, len(tokens))
    with KVStore(kv_client, layout, policy="tail") as store:
        store.save(tokens, LayerArrays(layout, src))
        hashes = store.hashes(tokens)
        key = page_keys.page_key(hashes[2], 3)
        kv_client.delete(key, group=store.key_groups(hashes, [key])[0])
        out = {layer: np.zeros_like(a) for layer, a in src.items()}
        handle = store.load(tokens, 5 * 64, LayerArrays(layout, out))
        assert handle.wait_layer(0, timeout_s=10) is True
        assert handle.wait(timeout_s=10) is False
        assert handle.failed_layers == [3]
        assert np.array_equal(out[0], src[0])
        only = store.load(tokens, 5 * 64, LayerArrays(layout, out), layers=[1])
        assert only.layers == (1,) and only.wait(timeout_s=10)


def test_keys_are_namespaced_by_model_and_rank(kv_client):
    tokens = tokens_of(3 * 64, 7)
    rank0 = hybrid(model="ns", tp_rank=0, tp_size=2)
    with KVStore(kv_client, rank0, policy="tail") as store:
        store.save(tokens, LayerArrays(rank0, kv_arrays(rank0, len(tokens))))
        assert store.match(tokens) == 3 * 64
    for other in (hybrid(model="ns", tp_rank=1, tp_size=2), hybrid(model="ns2", tp_rank=0,
                                                                  tp_size=2)):
        with KVStore(kv_client, other, policy="tail") as store:
            assert store.match(tokens) == 0


def test_full_layer_policy_stores_every_layer_of_every_page(kv_client):
    layout = hybrid(model="full-layer")
    tokens = tokens_of(4 * 64 + 3, 8)
    with KVStore(kv_client, layout, policy="full-layer") as store:
        saved = store.save(tokens, LayerArrays(layout, kv_arrays(layout, len(tokens))))
        assert saved.objects_written == 4 * layout.num_layers
        assert saved.bytes_written == 4 * layout.all_layers_page_bytes()
        assert store.match(tokens) == 4 * 64
        assert store.match(tokens[:3 * 64 + 1]) == 3 * 64     # any page boundary hits


def test_bad_inputs_are_refused_with_the_rule(kv_client):
    layout = hybrid(model="bad")
    tokens = tokens_of(2 * 64, 9)
    short = {layer: np.zeros((2 * 64, layout.layer_bytes_per_token(layer) - 1), np.uint8)
             for layer in range(layout.num_layers)}
    with KVStore(kv_client, layout, policy="tail") as store:
        with pytest.raises(InvalidRequest, match="not a multiple"):
            store.save(tokens, LayerArrays(layout, short))
        arrays = kv_arrays(layout, 64)                 # one page of KV for two pages of tokens
        with pytest.raises(InvalidRequest, match="outside"):
            store.save(tokens, LayerArrays(layout, arrays))
        with pytest.raises(InvalidRequest, match="multiple of the page size"):
            store.load(tokens, 65, LayerArrays(layout, arrays))
        with pytest.raises(InvalidRequest, match="within"):
            store.load(tokens, 3 * 64, LayerArrays(layout, arrays))
        with pytest.raises(InvalidRequest, match="outside 0..4"):
            store.save(tokens, LayerArrays(layout, arrays), layers=[7])


class EvictingAfterFirstLook:
    """A real client whose fill reading shows a roomy cluster the first time and evictions
    from then on (the pressure changes between an engine's per-layer saves)."""

    def __init__(self, client: Client) -> None:
        self.client, self.looks = client, 0

    def fill(self) -> Fill:
        self.looks += 1
        return Fill(used_bytes=1, capacity_bytes=1 << 30, evicted_objects=self.looks - 1,
                    servers=1)

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_a_layer_by_layer_save_writes_the_same_tails_in_every_sliding_layer(kv_client):
    # An engine saves one layer at a time; the pressure reading may change between layers.
    # Tails chosen per layer would then differ between sliding layers, and a tail that one of
    # them lacks is never confirmed by a probe, though it is the costliest object stored.
    layout = hybrid(window=128, page=64, model="plan")
    n_pages = 20
    tokens, src = tokens_of(n_pages * 64, 9), kv_arrays(layout, n_pages * 64)
    reader = EvictingAfterFirstLook(kv_client)
    with KVStore(reader, layout, policy="adaptive", pressure_poll_s=0.0) as store:
        under = {p: store.policy.tail_boundaries(n_pages, shared_pages=0, hit_pages=0,
                                                 pressure=p)
                 for p in (Pressure.ROOMY, Pressure.EVICTING)}
        assert under[Pressure.ROOMY] != under[Pressure.EVICTING]     # the change matters
        plan = store.plan_save(tokens)
        results = [store.save(tokens, LayerArrays(layout, src), plan=plan, layers=[layer])
                   for layer in range(layout.num_layers)]
        assert {r.tail_boundaries for r in results} == {plan.tails}
        assert list(plan.tails) == under[Pressure.ROOMY]
        hashes = store.hashes(tokens)
        for layer in layout.swa_layers:
            keys = [page_keys.tail_key(hashes[b - 1], layer) for b in range(1, n_pages + 1)]
            stored = [b for b, ok in zip(range(1, n_pages + 1), kv_client.batch_exists(
                keys, group=store.key_groups(hashes, keys))) if ok]
            assert stored == list(plan.tails), layer
        assert store.match(tokens) == n_pages * 64
        with pytest.raises(InvalidRequest, match="plan= or probe="):
            store.save(tokens, LayerArrays(layout, src), plan=plan,
                       probe=store.probe(tokens))
        with pytest.raises(InvalidRequest, match="its own tokens"):
            store.save(tokens[:5 * 64], LayerArrays(layout, src), plan=plan)


def test_pages_past_the_head_are_placed_by_the_first_page_past_it(kv_client):
    layout = hybrid(model="head-groups")
    tokens = tokens_of(8 * 64, 9)
    src = kv_arrays(layout, len(tokens), seed=9)
    with KVStore(kv_client, layout, policy="tail", group_head_tokens=2 * 64) as store:
        assert store.head_pages == 2
        store.save(tokens, LayerArrays(layout, src))
        hashes = store.hashes(tokens)
        keys = [page_keys.page_key(h, layer) for h in hashes for layer in store.paged_layers]
        groups = store.key_groups(hashes, keys)
        assert set(groups) == {hashes[0].hex(), hashes[2].hex()}
        assert all(kv_client.batch_exists(keys, group=groups))
        assert store.match(tokens) == 8 * 64
        out = {layer: np.zeros_like(a) for layer, a in src.items()}
        assert store.load(tokens, 8 * 64, LayerArrays(layout, out)).wait(timeout_s=10)
        for layer, want in expected_after_load(layout, src, 8 * 64).items():
            assert np.array_equal(out[layer], want), layer
        deep = page_keys.page_key(hashes[5], layout.full_layers[0])
        assert kv_client.delete(deep, group=store.key_groups(hashes, [deep])[0])
        assert store.match(tokens) < 6 * 64             # found where the store placed it
