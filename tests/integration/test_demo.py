"""``gcache demo`` (what ``make run`` runs) on a small part of the shipped trace, its printed
figures checked against the replay model computed here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from gcache.kv import ModelLayout
from gcache.kv.replay import replay_model
from gcache.kv.trace import BLOCK_SIZE, conversations, read_trace

TRACE = "data/traces/conversation_trace.jsonl"
# At half the full-layer working set the SWA-masked store evicts nothing on these requests
# (it writes under a third of it), so the cluster must hit exactly what the model hits, while
# full-layer storage evicts. Under eviction the two differ by a few points (per-layer objects,
# per-server budgets, the pressure each one reads): docs/getting-started.md's `make run` section.
CONVERSATIONS, BUDGET = 6, 0.5


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "demo.json"
    done = subprocess.run([sys.executable, "-m", "gcache.cli", "demo", "--quiet",
                           "--conversations", str(CONVERSATIONS), "--budget", str(BUDGET),
                           "--total", "32MiB", "--memory", "64MiB", "--timeout", "10",
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, json.loads(out.read_text())


@pytest.fixture(scope="module")
def model():
    from gcache.kv.replay import prepare
    layout = ModelLayout.from_config("mimo-v2.5-pro", page_size=BLOCK_SIZE)
    trace = prepare(conversations(read_trace(TRACE), limit=CONVERSATIONS), layout)
    rows = {r.policy: r for r in replay_model(trace, ["adaptive", "full-layer"], [BUDGET])}
    return layout, trace, rows


def figure(stdout: str, pattern: str) -> tuple[str, ...]:
    match = re.search(pattern, stdout)
    assert match, f"no line matching {pattern!r} in:\n{stdout}"
    return match.groups()


def test_the_hit_rate_printed_is_the_clusters_and_the_model_agrees(demo, model):
    stdout, figures = demo
    _, trace, rows = model
    hit, model_hit = map(float, figure(stdout, r"token hit rate ([\d.]+) .*the replay model on "
                                               r"the same requests: ([\d.]+)\)"))
    assert model_hit == pytest.approx(rows["adaptive"].hit_rate, abs=5e-5)
    assert hit == pytest.approx(figures["hit_tokens"] / trace.input_tokens, abs=5e-5)
    assert hit == pytest.approx(model_hit, abs=5e-5)
    assert figures["requests"] == len(trace.requests) and figures["loads"] > 0


def test_full_layer_storage_is_compared_at_the_same_memory_and_for_the_same_hits(demo, model):
    stdout, figures = demo
    _, trace, rows = model
    full_hit, = figure(stdout, r"full-layer storage in the same memory: hit rate ([\d.]+);")
    assert float(full_hit) == pytest.approx(rows["full-layer"].hit_rate, abs=5e-5)
    assert float(full_hit) < figures["hit_rate"]          # what storing the SWA mask buys
    fraction = figures["full_layer_same_hits_fraction"]
    at = lambda f: replay_model(trace, ["full-layer"], [f])[0].hit_rate  # noqa: E731
    assert at(fraction) >= figures["hit_rate"] > at(fraction - 0.001)
    figure(stdout, r"bytes stored ([\d.]+\w+) .* against ([\d.]+\w+) that "
                   r"full-layer storage writes for the same hits")
    assert figures["full_layer_stored_bytes"] == replay_model(trace, ["full-layer"],
                                                              [fraction])[0].stored_bytes
    assert figures["stored_bytes"] < figures["full_layer_stored_bytes"]


def test_loads_are_checked_byte_for_byte_and_the_boundary_is_window_safe(demo, model):
    stdout, figures = demo
    layout, _, _ = model
    corrupt, incomplete = figure(stdout, r"load latency p50 [\d.]+ ms, p90 [\d.]+ ms over \d+ "
                                         r"loads .* (\d+) corrupt, (\d+) incomplete")
    assert corrupt == incomplete == "0"
    p = figures["partly_shared"]
    assert p is not None and p["hit_tokens"] % layout.page_size == 0
    # the hit stops at or before the divergence, at a boundary whose tail exists
    assert p["hit_tokens"] <= p["stored_pages"] * layout.page_size <= p["shared_tokens"]
    assert f"loads {p['hit_tokens']} tokens and recomputes" in stdout


def test_the_raw_put_get_check_still_runs_after_it(demo):
    stdout, _ = demo
    assert re.search(r"gcache demo: blocks=\d+ .* corrupt=0", stdout), stdout


def _servers_of(pid: int) -> dict[int, str]:
    """The servers ``pid`` started: their PIDs and arena files (``--shm-name``). Other suites'
    servers may be making arenas beside them, so the test follows its own only."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as fh:
            children = [int(c) for c in fh.read().split()]
    except OSError:
        return {}
    found = {}
    for child in children:
        try:
            with open(f"/proc/{child}/cmdline", "rb") as fh:
                argv = fh.read().decode().split("\0")
        except OSError:
            continue
        if "--shm-name" in argv:
            found[child] = f"/dev/shm/{argv[argv.index('--shm-name') + 1]}"
    return found


def _is_server(pid: int, arena: str) -> bool:
    """Whether ``pid`` is still that server (not a process that reused its PID)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return os.path.basename(arena).encode() in fh.read()
    except OSError:
        return False


def test_a_terminated_demo_stops_its_servers_and_removes_their_arenas():
    import signal
    import time
    demo = subprocess.Popen([sys.executable, "-m", "gcache.cli", "demo", "--quiet",
                             "--conversations", "2", "--servers", "2", "--total", "0"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    servers: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and demo.poll() is None and \
                not (len(servers) == 2 and all(os.path.exists(p) for p in servers.values())):
            servers |= _servers_of(demo.pid)
            time.sleep(0.05)
        assert len(servers) == 2, "the demo's two servers never started"
        demo.send_signal(signal.SIGTERM)
        assert demo.wait(60) == 128 + signal.SIGTERM
        left = [p for name in servers.values() for p in (name, name + ".key")
                if os.path.exists(p)]
        assert not left, left
        assert not [pid for pid, name in servers.items() if _is_server(pid, name)]
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
        for pid, name in servers.items():       # only when the demo failed to clean up
            if _is_server(pid, name):
                os.kill(pid, signal.SIGKILL)
            for leftover in (name, name + ".key", name + ".id"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
