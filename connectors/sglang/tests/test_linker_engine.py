"""Engine tier of the GCache linker: real SGLang 0.5.23 engines on CPU, started with
``--enable-unified-cache-external-linker`` and GCache as their dynamic linker (no HiCache, no
host tier), against a real local GCache cluster.

Engine A computes a prompt and offloads its pages; engine B, a fresh process, loads the prefix
straight into its KV pool: the request reports the loaded tokens (SGLang counts a linker load
as ``host`` in ``cached_tokens_details``) and answers with A's greedy tokens, which are Hugging
Face ``transformers``' on the same weights (fp32).

A sliding-window model (Gemma 4) loads the same way, at window-safe boundaries. SGLang's CPU
attention on this machine (``torch_native``: no AMX) reads sliding layers at the wrong slots
after any load (``gcache_sglang.sliding_reads``), and the linker serves no sliding load there
(``test_linker.py``); so that test's engines run a test linker
(``plugins/sliding_reads_linker.py``) that makes those reads go through SGLang's own mapping,
as its ``intel_amx`` backend does, the linker itself unchanged.
"""

from __future__ import annotations

import pathlib
import re
import threading
import time
import urllib.error

import pytest
from engine_testing.tiny_models import gemma4, hf_greedy, llama, prompt_ids

from gcache.cli.local_cluster import LocalCluster
from gcache.sdk import Client

from .engine import Engine

NEW_TOKENS = 16
PAGE = 16
PLUGINS = pathlib.Path(__file__).resolve().parent / "plugins"

pytestmark = pytest.mark.timeout(600)


def linker_config(cluster: LocalCluster, module: str = "gcache_sglang.linker",
                  linker: str = "GCacheLinker") -> dict:
    return {"linker_module_path": module, "linker": linker,
            "linker_extra_config": {"gcache_servers": ",".join(cluster.addresses),
                                    "gcache_timeout_ms": 2000}}


def stored_objects(cluster: LocalCluster) -> int:
    with Client(cluster.addresses, timeout_s=5.0) as client:
        return sum(s["tier"]["objects"] for s in client.server_stats().values() if s)


def settle(cluster: LocalCluster, at_least: int, timeout_s: float = 30.0) -> int:
    """The linker offloads on its own thread after the tree inserts: wait until the count
    stops growing (and has reached ``at_least``)."""
    deadline, last = time.monotonic() + timeout_s, -1
    while time.monotonic() < deadline:
        now = stored_objects(cluster)
        if now >= at_least and now == last:
            return now
        last = now
        time.sleep(0.5)
    raise TimeoutError(f"GCache holds {stored_objects(cluster)} objects, expected {at_least}")


def hits(engine: Engine) -> list[tuple[int, int, int]]:
    """(pages, of tail pages, full layers stored) of every linker hit in the engine's log."""
    text = engine.log_path.read_text(errors="replace")
    return [tuple(map(int, m)) for m in re.findall(
        r"gcache linker hit: rid=\S+ pages=(\d+) of (\d+) \(full layers stored: (\d+)\)", text)]


def generate_or_abort(engine: Engine, ids: list[int]) -> dict:
    """A reply, or ``{"aborted": reason}`` when SGLang aborted the request."""
    try:
        reply = engine.generate(ids, NEW_TOKENS)
    except urllib.error.HTTPError as exc:
        return {"aborted": f"HTTP {exc.code}: {exc.read()[:300]!r}"}
    finish = reply["meta_info"].get("finish_reason") or {}
    if finish.get("type") == "abort":
        return {"aborted": str(finish)}
    return reply


@pytest.fixture(scope="module")
def llama_model(tmp_path_factory):
    path = llama(tmp_path_factory.mktemp("models") / "tiny-llama")
    ids = prompt_ids(path)
    other = [ids[0] + 1, *ids[1:]]                   # no page in common with ``ids``
    return path, ids, hf_greedy(path, ids, NEW_TOKENS), other, hf_greedy(path, other,
                                                                          NEW_TOKENS)


def test_a_fresh_engine_loads_the_prefix_and_a_server_killed_mid_load_aborts_one_request(
        llama_model, gcache, engines):
    path, ids, reference, other, other_reference = llama_model
    pages = len(ids) // PAGE
    a = engines(path, gcache.addresses, linker=linker_config(gcache))
    assert a.generate(ids, NEW_TOKENS)["output_ids"] == reference
    settle(gcache, 2 * 2 * pages)                    # K and V of 2 layers per page
    a.stop()

    # engine B, fresh: the prefix comes from GCache, layer by layer into its pool. Its linker
    # kills a server in the middle of its second load batch (after the first layer).
    victim = gcache.servers[1]
    b = engines(path, gcache.addresses,
                linker=linker_config(gcache, "killing_linker", "KillingLinker"),
                env={"PYTHONPATH": str(PLUGINS), "GCACHE_TEST_KILL_ON_LOAD": "2",
                     "GCACHE_TEST_KILL_PID": str(victim.pid)})
    first = b.generate(ids, NEW_TOKENS)
    assert first["meta_info"]["cached_tokens"] == pages * PAGE
    assert first["meta_info"]["cached_tokens_details"] == {"device": 0, "host": pages * PAGE}
    assert first["output_ids"] == reference
    assert hits(b)[-1] == (pages, pages, pages)

    # the prefix loads again (the device cache flushed) while another request computes beside
    # it; the server dies during the load: that request alone is aborted
    b.flush()
    replies: dict[str, dict] = {}
    threads = [threading.Thread(target=lambda k, x: replies.__setitem__(k, generate_or_abort(
        b, x)), args=(k, x)) for k, x in (("loading", ids), ("computing", other))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not victim.is_running()
    assert "aborted" in replies["loading"], replies["loading"]
    assert replies["computing"]["output_ids"] == other_reference
    assert "External linker load failed" in b.log_path.read_text(errors="replace")
    # the engine goes on; the same request again is answered right (what the surviving server
    # holds is loaded, the rest computed)
    again = b.generate(ids, NEW_TOKENS)
    assert again["output_ids"] == reference
    assert b.request("GET", "/health") is not None


@pytest.fixture(scope="module")
def gemma_model(tmp_path_factory):
    path = gemma4(tmp_path_factory.mktemp("models") / "tiny-gemma4", window=32)
    ids = prompt_ids(path)
    branch = ids[:160] + [7, 9, 11, 13] * 5           # shares 10 pages with ``ids``
    return path, ids, hf_greedy(path, ids, NEW_TOKENS), branch, hf_greedy(path, branch,
                                                                           NEW_TOKENS)


def test_a_fresh_engine_loads_a_sliding_window_prefix_at_a_window_safe_boundary(
        gemma_model, gcache, engines):
    """Gemma 4 (sliding and full layers alternate, window 32 tokens = 2 pages). A stores its
    nodes: pages 0-5 (a first request ends a node there) and 6 on, the sliding layers only
    each node's last two pages. B's branch shares 10 pages with A's prompt; GCache holds the
    full layers of all 10 but the sliding window only before page 6, so B loads 6 pages (the
    window-safe boundary), computes the rest, and answers Hugging Face's tokens."""
    path, ids, reference, branch, branch_reference = gemma_model
    plugin = {"linker": linker_config(gcache, "sliding_reads_linker", "TranslatedReadsLinker"),
              "env": {"PYTHONPATH": str(PLUGINS)}}
    a = engines(path, gcache.addresses, **plugin)
    a.generate(ids[:100], NEW_TOKENS)                # node boundary at 6 pages
    assert a.generate(ids, NEW_TOKENS)["output_ids"] == reference
    settle(gcache, 2 * 2 * (len(ids) // PAGE))
    a.stop()

    b = engines(path, gcache.addresses, **plugin)
    got = b.generate(branch, NEW_TOKENS)
    assert hits(b)[-1] == (6, len(branch) // PAGE, 10)
    assert got["meta_info"]["cached_tokens_details"] == {"device": 0, "host": 6 * PAGE}
    assert got["output_ids"] == branch_reference
