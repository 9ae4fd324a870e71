"""``LoadHandle.run``: consecutive small layers share one fetch, a big layer fetches alone, and
each layer still reports on its own objects."""

from gcache.kv.load import LoadHandle


def plan_of(sizes_per_layer: list[list[int]]) -> list[tuple[int, list, list]]:
    return [(layer, [f"{layer}/{i}" for i in range(len(sizes))],
             [bytearray(n) for n in sizes])
            for layer, sizes in enumerate(sizes_per_layer)]


def test_small_layers_share_a_fetch_and_a_big_one_goes_alone():
    calls: list[list[str]] = []

    def fetch(keys, outs):
        calls.append(list(keys))
        return [True] * len(keys)
    plan = plan_of([[100], [100], [5000], [100], [100]])
    handle = LoadHandle([layer for layer, _, _ in plan])
    handle.run(plan, fetch, group_bytes=4096, group_keys=256)
    # layers 0-2 fill the first group (it passes 4096 bytes with layer 2), 3-4 the next
    assert calls == [["0/0", "1/0", "2/0"], ["3/0", "4/0"]]
    assert handle.wait(timeout_s=1) and handle.failed_layers == []


def test_a_missing_object_fails_only_its_own_layer():
    plan = plan_of([[10, 10], [10], [10, 10]])
    handle = LoadHandle([layer for layer, _, _ in plan])
    handle.run(plan, lambda keys, outs: [k != "2/1" for k in keys])
    assert handle.wait(timeout_s=1) is False and handle.failed_layers == [2]


def test_the_key_cap_splits_a_group_and_a_raising_fetch_fails_its_group_only():
    seen: list[int] = []

    def fetch(keys, outs):
        seen.append(len(keys))
        if "1/0" in keys:
            raise RuntimeError("server gone")
        return [True] * len(keys)
    plan = plan_of([[1, 1], [1, 1], [1, 1]])
    handle = LoadHandle([layer for layer, _, _ in plan])
    handle.run(plan, fetch, group_keys=2)
    assert seen == [2, 2, 2] and handle.failed_layers == [1]
