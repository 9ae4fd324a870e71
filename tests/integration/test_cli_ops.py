"""``gcache top``, ``gcache status`` and ``gcache explain`` against real clusters: what they
print after traffic the tests make, after a page key is deleted and after a server is killed."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from gcache.cli.local_cluster import LocalCluster
from gcache.cli.local_masters import LocalMasters
from gcache.kv import KVStore, LayerArrays, ModelLayout
from gcache.kv.page_keys import page_key
from gcache.master_client import MasterClient
from gcache.sdk import Client
from tests.helpers import wait_until

TINY_HYBRID = {"num_hidden_layers": 5, "hybrid_layer_pattern": [0, 1, 1, 0, 1],
               "sliding_window": 128, "num_key_value_heads": 1, "head_dim": 4, "v_head_dim": 2,
               "swa_num_key_value_heads": 2, "swa_head_dim": 4, "swa_v_head_dim": 2,
               "torch_dtype": "float32"}
PAGE = 64


def gcache(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gcache.cli", *args], capture_output=True,
                          text=True, timeout=120)


def top_rows(stdout: str) -> dict[str, list[str]]:
    """The table's rows by their last server field (the address), cells split on spaces."""
    rows = {}
    for line in stdout.splitlines()[2:]:
        if not line or line.startswith(("misses", "this poller", " ")) or ":" not in line:
            continue
        cells = line.split()
        if cells[0].count(".") == 3:
            rows[cells[0]] = cells[1:]
        elif len(cells) > 1 and cells[1].count(".") == 3:       # "id address ..."
            rows[cells[1]] = cells[2:]
    return rows


def traffic(client: Client, round_: int) -> None:
    """Puts, hits and misses spread over the servers."""
    keys = [f"ops-{round_}-{i}" for i in range(32)]
    assert all(client.batch_put(keys, [b"v" * 4096] * len(keys)))
    client.batch_get(keys + [f"absent-{round_}-{i}" for i in range(8)])


def test_top_once_shows_each_servers_ops_and_a_killed_server_as_down(cluster_factory):
    cluster = cluster_factory(2)
    servers = ",".join(cluster.addresses)
    top = subprocess.Popen([sys.executable, "-m", "gcache.cli", "top", "--once", "--interval",
                            "3", "--servers", servers], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        with Client(cluster.addresses, timeout_s=2.0) as client:
            round_ = 0
            while top.poll() is None:                  # traffic during both of its polls
                traffic(client, round_)
                round_ += 1
        stdout, stderr = top.communicate(timeout=60)
    finally:
        if top.poll() is None:
            top.kill()
            top.wait(10)
    assert top.returncode == 0, stderr
    assert stdout.startswith("gcache top: 2 servers")
    assert "OPS/S" in stdout and "P99" in stdout and "STAT has no byte counters" in stdout
    rows = top_rows(stdout)
    assert set(rows) == set(cluster.addresses), stdout
    for address, cells in rows.items():
        state, ops, reads, puts, hit = cells[:5]
        assert state == "up" and int(ops) > 0 and int(reads) > 0 and int(puts) > 0, stdout
        assert 0 < float(hit.rstrip("%")) < 100, stdout        # the absent keys missed
        assert cells[-1] == "-"                                  # no p99 in STAT
        assert f"  {address}: absent=" in stdout

    cluster.kill(1)
    after = gcache("top", "--once", "--interval", "0.2", "--servers", servers)
    assert after.returncode == 0, after.stderr
    rows = top_rows(after.stdout)
    assert rows[cluster.addresses[1]][0] == "down", after.stdout
    assert rows[cluster.addresses[0]][0] == "up", after.stdout
    assert "failed STATs by reason (why a server shows down): unreachable=" in after.stdout


def test_status_and_top_of_a_master_show_tier_usage_and_hit_rates(tmp_path):
    with LocalMasters(1, log_dir=str(tmp_path / "m")) as masters, \
            LocalCluster(2, memory="64MiB", master=masters.spec,
                         server_args=("--segment-size", "4MiB"),
                         log_dir=str(tmp_path / "s")) as cluster:
        link = MasterClient(masters.addresses, timeout_s=2.0)
        try:
            wait_until(lambda: len(link.status().servers) == 2, 20)
            ids = {s.address: s.id for s in link.status().servers}
        finally:
            link.close()
        with Client(master=masters.spec, timeout_s=2.0) as client:
            wait_until(lambda: len(client.stats()["servers"]) == 2, 10)
            traffic(client, 0)
            explained = explain_a_lost_page(client, cluster.addresses, tmp_path,
                                            "--master", masters.spec)
        out = gcache("status", "--master", masters.spec)
        assert out.returncode == 0, out.stderr
        assert out.stdout.count("leader,") == 1
        for address in cluster.addresses:
            assert f"server {ids[address]}: {address} alive" in out.stdout
        assert out.stdout.count("  tier hot: ") == 2, out.stdout
        assert "of 64.0MiB used" in out.stdout
        reads = [line for line in out.stdout.splitlines() if line.startswith("  reads: ")]
        assert len(reads) == 2 and all("hit rate" in line for line in reads)
        hits = sum(int(line.split("hits=")[1].split()[0]) for line in reads)
        misses = sum(int(line.split("misses=")[1].split()[0]) for line in reads)
        assert hits == 32 and misses == 8, out.stdout         # EXISTS are not reads

        lost, owner, short = explained
        assert f"  {lost} on {ids[owner]} {owner} up" in short      # placed as the map says

        top = gcache("top", "--once", "--interval", "0.2", "--master", masters.spec)
        assert top.returncode == 0, top.stderr
        assert f"({masters.spec})" in top.stdout.splitlines()[0]
        rows = top_rows(top.stdout)
        assert set(rows) == set(cluster.addresses), top.stdout
        assert all(cells[0] == "up" for cells in rows.values())
        assert all(f"{ids[a]} {a}" in top.stdout for a in cluster.addresses)

        cluster.kill(1)                        # before the masters notice: alive in the map
        down = gcache("top", "--once", "--interval", "0.2", "--master", masters.spec)
        assert top_rows(down.stdout)[cluster.addresses[1]][0] == "down", down.stdout
        after = gcache("status", "--master", masters.spec)
        assert after.returncode == 0, after.stderr
        assert after.stdout.count("  stat: no answer (down)") == 1, after.stdout
        assert after.stdout.count("  tier hot: ") == 1


def held_by(addresses: list[str], key: str) -> str:
    """The one server that holds ``key``, asked one by one."""
    holders = []
    for address in addresses:
        with Client([address], timeout_s=2.0) as one:
            if one.exists(key):
                holders.append(address)
    assert len(holders) == 1, holders
    return holders[0]


def explain_a_lost_page(client: Client, addresses: list[str], tmp_path,
                        *where: str) -> tuple[str, str, str]:
    """Save 3 pages, delete the middle one's first paged layer; (its key, the server that held
    it, what explain prints then)."""
    config = tmp_path / "tiny-hybrid.json"
    config.write_text(json.dumps(TINY_HYBRID))
    layout = ModelLayout.from_config(str(config), page_size=PAGE)
    tokens = list(range(3 * PAGE))
    kv = {layer: np.ones((len(tokens), layout.layer_bytes_per_token(layer)), dtype=np.uint8)
          for layer in range(layout.num_layers)}
    with KVStore(client, layout, policy="tail") as store:
        assert store.save(tokens, LayerArrays(layout, kv)).objects_failed == 0
        hashes = store.hashes(tokens)
        lost = page_key(hashes[1], layout.full_layers[0])
        owner = held_by(addresses, lost)
        assert client.delete(lost, group=store.key_groups(hashes, [lost])[0])
    out = gcache("explain", "--model", str(config), "--tokens", ",".join(map(str, tokens)),
                 *where)
    assert out.returncode == 0, out.stderr
    assert "window-safe boundary: 0 tokens (0 of 3 pages)" in out.stdout, out.stdout
    assert "first missing full-attention page: 1 (tokens [64, 128))" in out.stdout
    return lost, owner, out.stdout


def test_explain_shows_the_boundary_and_names_a_missing_page_and_its_server(cluster_factory,
                                                                           tmp_path):
    cluster = cluster_factory(2)
    servers = ",".join(cluster.addresses)
    config = tmp_path / "tiny-hybrid.json"
    config.write_text(json.dumps(TINY_HYBRID))
    layout = ModelLayout.from_config(str(config), page_size=PAGE)
    n = 10 * PAGE + 7
    tokens = list(range(5000, 5000 + n))
    token_text = ",".join(map(str, tokens))
    rng = np.random.default_rng(0)
    kv = {layer: rng.integers(1, 256, (n, layout.layer_bytes_per_token(layer)), dtype=np.uint8)
          for layer in range(layout.num_layers)}

    def explain(*extra: str) -> str:
        out = gcache("explain", "--model", str(config), "--tokens", token_text,
                     "--servers", servers, *extra)
        assert out.returncode == 0, out.stderr
        return out.stdout

    empty = gcache("explain", "--model", "gemma-3-1b", "--tokens", token_text,
                   "--servers", servers)
    assert empty.returncode == 0, empty.stderr
    assert "window-safe boundary: 0 tokens (0 of 10 pages)" in empty.stdout
    assert "first missing full-attention page: 0 (tokens [0, 64))" in empty.stdout

    with Client(cluster.addresses, timeout_s=2.0) as client, \
            KVStore(client, layout, policy="checkpoint-4") as store:
        assert store.save(tokens, LayerArrays(layout, kv)).objects_failed == 0
        assert store.match(tokens) == 10 * PAGE
        whole = explain()
        assert "tokens: 647, full pages: 10; the last 7 tokens are a partial page" in whole
        assert "full-attention pages present (every paged layer): 0-9 (10 of 10)" in whole
        assert "window tails present, every sliding layer (boundary in pages): 4, 8, 10" in whole
        assert "window-safe boundary: 640 tokens (10 of 10 pages)" in whole
        assert "why: every full page hits, with its window tail" in whole

        hashes = store.hashes(tokens)
        lost = page_key(hashes[6], layout.full_layers[1])
        owner = held_by(cluster.addresses, lost)
        assert client.delete(lost, group=store.key_groups(hashes, [lost])[0])
        assert store.match(tokens) == 4 * PAGE
        short = explain()
        assert "window-safe boundary: 256 tokens (4 of 10 pages)" in short
        assert "first missing full-attention page: 6 (tokens [384, 448))" in short
        assert f"  {lost} on {owner} up" in short
        assert "no complete window tail covers the window before any boundary in 5..6; the " \
               "last complete one is at 4" in short

        victim = cluster.addresses.index(owner)
        cluster.kill(victim)
        down = explain()
        assert f"{owner} down (no STAT answer)" in down
        assert f"  {cluster.addresses[1 - victim]} up: " in down
        assert f"  {owner} down (no STAT answer): 0 of the " in down


def test_explain_refuses_bad_tokens_and_a_prompt_without_a_tokenizer():
    bad = gcache("explain", "--model", "gemma-3-1b", "--tokens", "1,2,x", "--servers",
                 "127.0.0.1:1")
    assert bad.returncode == 2 and "token 'x' is not a non-negative integer" in bad.stderr
    prompt = gcache("explain", "--model", "gemma-3-1b", "--prompt", "hello", "--servers",
                    "127.0.0.1:1")
    assert prompt.returncode == 2 and "--prompt needs --tokenizer" in prompt.stderr


@pytest.mark.skipif(importlib.util.find_spec("transformers") is not None,
                    reason="transformers is installed")
def test_explain_says_a_prompt_needs_transformers(tmp_path):
    out = gcache("explain", "--model", "gemma-3-1b", "--prompt", "hello", "--tokenizer",
                 str(tmp_path), "--servers", "127.0.0.1:1")
    assert out.returncode == 2 and "needs the transformers package" in out.stderr
