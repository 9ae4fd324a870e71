"""``--load-format gcache``'s weight reader against a real local cluster of three servers:
safetensors shards pushed with ``gcache.files`` come back tensor for tensor as safetensors reads
them from disk, through segments small enough that tensors straddle them; a shard or a chunk
GCache lacks is read from the local directory (and logged); a shard pushed again mid-load is an
error, not a mix. The engine itself loading with it is in ``test_engine.py``.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from gcache.cli.local_cluster import LocalCluster
from gcache.errors import ConfigError
from gcache.files import FileStore
from gcache.files.directory import DirectoryChanged, push_directory
from gcache.files.file_keys import chunk_key, host_key
from gcache.sdk import Client
from gcache_vllm.loader import GCacheWeights, file_store, loader_settings, register

CHUNK = 32 << 10
NAME = "models/tiny"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    logs = tmp_path_factory.mktemp("gcache")
    with LocalCluster(3, memory="64MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(logs)) as cluster, \
            Client(cluster.addresses, timeout_s=5.0) as client:
        yield FileStore(client, chunk_size=CHUNK)


@pytest.fixture
def model_dir(tmp_path):
    """Two shards and their index; odd-sized int8 and bool tensors put the next float tensors
    at offsets no multiple of their item size."""
    g = torch.Generator().manual_seed(0)
    first = {"embed.weight": torch.randn(300, 64, generator=g),
             "odd.mask": torch.rand(13, generator=g) > 0.5,
             "layer.0.bias": torch.randn(777, generator=g, dtype=torch.float64),
             "layer.0.weight": torch.randn(129, 257, generator=g).to(torch.bfloat16),
             "empty": torch.empty(0, 8)}
    second = {"codes": torch.randint(-100, 100, (5001,), generator=g, dtype=torch.int8),
              "layer.1.weight": torch.randn(200, 100, generator=g).to(torch.float16),
              "steps": torch.arange(999, dtype=torch.int64)}
    save_file(first, tmp_path / "model-00001-of-00002.safetensors")
    save_file(second, tmp_path / "model-00002-of-00002.safetensors")
    weight_map = {**dict.fromkeys(first, "model-00001-of-00002.safetensors"),
                  **dict.fromkeys(second, "model-00002-of-00002.safetensors")}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (tmp_path / "config.json").write_text("{}")
    return tmp_path


def expected(model_dir) -> dict[str, torch.Tensor]:
    out = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def read(store, model_dir, name=NAME) -> tuple[dict[str, torch.Tensor], GCacheWeights]:
    weights = GCacheWeights(store, name, str(model_dir), prefetch_bytes=3 * CHUNK,
                            segment_bytes=2 * CHUNK)
    got: dict[str, torch.Tensor] = {}
    for key, tensor in weights:
        assert key not in got, f"{key} was given twice"
        got[key] = tensor
    return got, weights


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for key, tensor in want.items():
        assert got[key].dtype == tensor.dtype and got[key].shape == tensor.shape, key
        assert torch.equal(got[key], tensor), key


def test_shards_read_from_gcache_equal_safetensors_from_disk(store, model_dir):
    push_directory(store, model_dir, NAME)
    got, weights = read(store, model_dir)
    assert_same(got, expected(model_dir))
    assert weights.from_gcache == ["model-00001-of-00002.safetensors",
                                   "model-00002-of-00002.safetensors"]
    assert weights.from_disk == []
    assert weights.bytes_read >= sum(p.stat().st_size for p in model_dir.glob("*.safetensors")) \
        - 2 * CHUNK


def test_a_shard_gcache_lacks_is_read_from_disk_and_logged(store, model_dir, caplog):
    name = NAME + "-lacking"
    push_directory(store, model_dir, name)
    store.delete(f"{name}/model-00002-of-00002.safetensors")
    with caplog.at_level(logging.WARNING, logger="vllm.gcache_vllm.loader"):
        got, weights = read(store, model_dir, name)
    assert_same(got, expected(model_dir))
    assert weights.from_disk == ["model-00002-of-00002.safetensors"]
    assert "model-00002-of-00002.safetensors is not in GCache" in caplog.text


def test_a_lost_chunk_reads_the_rest_of_its_shard_from_disk(store, model_dir, caplog):
    name = NAME + "-lost-chunk"
    push_directory(store, model_dir, name)
    manifest = store.stat(f"{name}/model-00001-of-00002.safetensors")
    assert len(manifest.chunks) >= 4
    assert store.client.delete(chunk_key(manifest.chunks[3]))
    with caplog.at_level(logging.WARNING, logger="vllm.gcache_vllm.loader"):
        got, weights = read(store, model_dir, name)
    assert_same(got, expected(model_dir))
    assert weights.from_disk == ["model-00001-of-00002.safetensors"]
    assert "reading the rest of model-00001-of-00002.safetensors from disk" in caplog.text


def test_a_shard_pushed_again_mid_load_is_an_error_not_a_mix(store, model_dir):
    name = NAME + "-pushed-again"
    push_directory(store, model_dir, name)
    weights = iter(GCacheWeights(store, name, str(model_dir), segment_bytes=2 * CHUNK))
    next(weights)                                   # the first shard is under way
    save_file({"x": torch.ones(3)}, model_dir / "other.safetensors")
    store.put_file(f"{name}/model-00002-of-00002.safetensors", model_dir / "other.safetensors")
    with pytest.raises(DirectoryChanged, match="model-00002-of-00002.safetensors was pushed "
                                               "again"):
        list(weights)


def test_nothing_in_gcache_loads_every_shard_from_disk(store, model_dir):
    got, weights = read(store, model_dir, "models/never-pushed")
    assert_same(got, expected(model_dir))
    assert len(weights.from_disk) == 2 and weights.from_gcache == []


def test_with_the_host_cache_a_second_load_finds_the_foreign_chunks_on_this_host(store,
                                                                                 model_dir):
    name = NAME + "-host"
    push_directory(store, model_dir, name)
    with file_store({"host_cache": True}, store.client) as cached:
        assert cached.host_cache is not None
        host = cached.reader.host_server
        got, weights = read(cached, model_dir, name)
        assert_same(got, expected(model_dir))
        digests = {d for path in weights.from_gcache
                   for d in cached.stat(f"{name}/{path}").chunks}
        foreign = [d for d in digests if store.client.owner(chunk_key(d)) != host]
        assert foreign and all(cached.host_cache.batch_exists([host_key(d) for d in foreign]))
        hits = cached.host_cache.stats()["hits"]
        got, _ = read(cached, model_dir, name)
        assert_same(got, expected(model_dir))
        assert cached.host_cache.stats()["hits"] - hits >= len(foreign)


@pytest.mark.requires_gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="requires_gpu: no CUDA device (torch.cuda.is_available() is False)")
def test_for_a_model_on_a_gpu_the_weights_are_read_into_page_locked_memory(store, model_dir):
    name = NAME + "-pinned"
    push_directory(store, model_dir, name)
    weights = GCacheWeights(store, name, str(model_dir), prefetch_bytes=3 * CHUNK,
                            segment_bytes=2 * CHUNK, pin_memory=True)
    got = dict(iter(weights))
    assert_same(got, expected(model_dir))
    assert got["embed.weight"].is_pinned()       # a view of its segment (or its straddler)


def test_settings_are_checked_by_name():
    assert loader_settings({"gcache_servers": "127.0.0.1:1", "gcache_name": "m"})[
        "prefetch_mb"] == 256
    with pytest.raises(ConfigError, match="gcache_name"):
        loader_settings({"gcache_servers": "127.0.0.1:1"})
    with pytest.raises(ConfigError, match="gcache_policy"):
        loader_settings({"gcache_servers": "127.0.0.1:1", "gcache_name": "m",
                         "gcache_policy": "tail"})
    with pytest.raises(ConfigError, match="num_threads"):
        loader_settings({"gcache_servers": "127.0.0.1:1", "gcache_name": "m",
                         "num_threads": 4})
    with pytest.raises(ConfigError, match="gcache_prefetch_mb"):
        loader_settings({"gcache_servers": "127.0.0.1:1", "gcache_name": "m",
                         "gcache_prefetch_mb": 0})
    assert loader_settings({"gcache_servers": "127.0.0.1:1", "gcache_name": "m"})[
        "host_cache"] is False
    assert loader_settings({"gcache_servers": "127.0.0.1:1", "gcache_name": "m",
                            "gcache_host_cache": "true"})["host_cache"] is True
    with pytest.raises(ConfigError, match="gcache_host_cache"):
        loader_settings({"gcache_servers": "127.0.0.1:1", "gcache_name": "m",
                         "gcache_host_cache": 1})


def test_the_plugin_registers_the_load_format():
    from importlib.metadata import entry_points

    from vllm.config.load import LoadConfig
    from vllm.model_executor.model_loader import get_model_loader
    plugins = {e.value for e in entry_points(group="vllm.general_plugins")}
    assert "gcache_vllm.loader:register" in plugins       # what vLLM calls in each process
    register()
    loader = get_model_loader(LoadConfig(load_format="gcache", model_loader_extra_config={
        "gcache_servers": "127.0.0.1:1", "gcache_name": "m"}))
    assert type(loader).__name__ == "GCacheModelLoader"
    assert loader.settings["name"] == "m"
