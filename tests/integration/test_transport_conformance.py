"""One conformance suite for every ``Exchange`` (``gcache.sdk.exchange``): the same operations,
batches, misses and faults over ``tcp``, ``shm`` and ``nixl`` against real servers on loopback,
and over ``tcp`` and ``nixl`` against servers on other hosts (network namespaces joined by a
bridge, ``tests/network_hosts.py``), where NIXL runs over UCX's TCP transport on the bridge.

A transport is one of ``LINKS``; what a test needs that only some transports have (leases, the
NIXL registration) it says with ``only``.
"""

from __future__ import annotations

import itertools
import mmap
import os
import time
import weakref

import numpy as np
import pytest

from gcache.cli.local_cluster import LocalCluster
from gcache.sdk import Client
from tests.helpers import wait_until
from tests.network_hosts import available as netns_unavailable

nixl = pytest.importorskip("nixl_cu12", reason="NIXL (pip install --no-deps nixl-cu12==1.5.1)")

LINKS = ["tcp", "shm", "nixl", "tcp-netns", "nixl-netns"]
TOKEN = "conformance-token"             # off loopback a token is required; used everywhere
# the default lease TTL: a 1 s one's write window (half of it) ran out under make test's load
SERVER_ARGS = ("--segment-size", "4MiB", "--nixl", "--token", TOKEN, "--unreachable-sweep", "0.2")
SIZES = [1, 4096 + 3, 3 << 20]          # a byte, a page and a bit, several io_size pieces
_keys = itertools.count()


def data(size: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def key(prefix: str = "k") -> str:
    return f"{prefix}/{os.getpid()}/{next(_keys)}"


@pytest.fixture(scope="module")
def loopback(tmp_path_factory):
    with LocalCluster(2, memory="128MiB", server_args=SERVER_ARGS,
                      log_dir=str(tmp_path_factory.mktemp("loopback"))) as cluster:
        yield cluster


# UCX held to TCP, as between machines. This process reaches the hosts through a bridge, which
# UCX's TCP transport uses only when told (tests/conftest.py does) and only when the bridge was
# there before the process's first agent: UCX lists a process's interfaces once.
NETNS_UCX = {"UCX_TLS": "tcp"}


@pytest.fixture(scope="module", autouse=True)
def other_hosts(tmp_path_factory, nixl_network_hosts):
    """Two servers on two network hosts, started under ``NETNS_UCX``; the hosts were made
    before any agent of this process (tests/conftest.py). None where namespaces cannot be
    made here."""
    net = nixl_network_hosts
    if net is None:
        yield None
        return
    with pytest.MonkeyPatch.context() as env:
        for name, value in NETNS_UCX.items():
            env.setenv(name, value)                 # for the servers' start only
        cluster = LocalCluster(2, memory="128MiB", server_args=SERVER_ARGS, hosts=net.hosts(),
                               log_dir=str(tmp_path_factory.mktemp("netns")))
        cluster.start()
        env.undo()
        try:
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture(params=LINKS)
def link(request, monkeypatch):
    """(transport, cluster) for one of ``LINKS``; across hosts our agents use ``NETNS_UCX``."""
    transport, _, where = request.param.partition("-")
    cluster = request.getfixturevalue("other_hosts" if where else "loopback")
    if cluster is None:
        pytest.skip(netns_unavailable())
    if where:
        for name, value in NETNS_UCX.items():
            monkeypatch.setenv(name, value)
    return transport, cluster


@pytest.fixture
def client(link):
    transport, cluster = link
    with Client(cluster.addresses, timeout_s=5.0, transport=transport, token=TOKEN) as c:
        yield c
        stats = c.stats()
        reached = {t for t in stats["transports"].values() if t is not None}
        assert reached <= {transport}, f"asked for {transport}, reached over {reached}"


def only(client, *transports: str) -> str:
    transport = client.config.transport
    if transport not in transports:
        pytest.skip(f"{transport} has no such thing (only {', '.join(transports)})")
    return transport


# ---- every operation ----------------------------------------------------------------------------

def test_values_put_with_a_parent_keep_it(client):
    """A parent rides in the key field over every link (PUT, BATCH_PUT, ALLOC): the values read
    back as put, and each server counts those whose parent it does not hold."""
    def unreachable() -> int:
        return sum(s["tier"]["unreachable_objects"] for s in client.server_stats().values())

    before = unreachable()
    gone = [key("gone") for _ in range(8)]      # one of eight is on a value's server (1 - 2^-8)
    keys, values = [key("child") for _ in range(4)], [data(size, 9) for size in SIZES + [7]]
    assert client.batch_put(keys[:3], values[:3], parents=[gone] * 3) == [True] * 3
    assert client.put(keys[3], values[3], parent=gone) is True
    assert [client.get(k) for k in keys] == values
    wait_until(lambda: unreachable() - before == 4, 10.0)


@pytest.mark.parametrize("size", SIZES)
def test_every_operation_round_trips(client, size):
    raw, k = data(size, size), key()
    assert client.put(k, raw) is True
    assert client.exists(k) is True
    assert client.get(k) == raw
    out = np.zeros(size + 5, dtype=np.uint8)
    assert client.get_into(k, out) == size and out[:size].tobytes() == raw
    assert client.put_async(k, raw[::-1]).result() is True          # replaced
    assert client.get_async(k).result() == raw[::-1]
    assert client.get_into_async(k, out).result() == size and out[:size].tobytes() == raw[::-1]
    assert client.delete(k) is True
    assert client.exists(k) is False and client.get(k) is None
    assert client.delete(k) is False


def test_batches_span_both_servers_with_absent_keys_among_them(client):
    keys = [key("batch") for _ in range(40)]
    values = [data(1000 + 997 * i, i) for i in range(40)]
    assert client.batch_put(keys, values) == [True] * 40
    asked = keys + [key("never")]
    assert client.batch_exists(asked) == [True] * 40 + [False]
    assert client.batch_get(asked) == values + [None]
    outs = [np.zeros(len(v), dtype=np.uint8) for v in values] + [np.zeros(8, dtype=np.uint8)]
    assert client.batch_get_into(asked, outs) == [len(v) for v in values] + [None]
    assert all(o.tobytes() == v for o, v in zip(outs, values))
    assert client.stats()["misses_by_reason"]["absent"] == 2      # exists is no miss


def test_every_put_is_hashed_as_it_lands_not_again_at_commit(client):
    """Single and batch puts announce (shm, NIXL) or stream (TCP) their pieces in order, so
    the server hashes each as it lands and COMMIT finds the value's hash done."""
    def whole_hashes() -> int:
        return sum(s["tier"]["whole_hashes"] for s in client.server_stats().values())

    before = whole_hashes()
    keys = [key("streamed") for _ in range(12)]
    values = [data(size, i) for i, size in enumerate([1, 4099, 3 << 20] * 4)]
    assert all(client.put(k, v) for k, v in zip(keys[:3], values[:3]))
    assert client.batch_put(keys[3:], values[3:]) == [True] * 9
    assert whole_hashes() == before
    assert client.batch_get(keys) == values


def test_an_out_smaller_than_the_value_is_a_clear_error_and_the_link_recovers(client):
    k = key()
    assert client.put(k, data(5000, 1))
    with pytest.raises(ValueError, match="out is 4999 bytes; the value is 5000 bytes"):
        client.get_into(k, bytearray(4999))
    assert client.get(k) == data(5000, 1)


# ---- faults -------------------------------------------------------------------------------------

def _flip_stored_byte(cluster: LocalCluster, value: bytes) -> None:
    """Flip one byte of ``value`` where a server's arena holds it (network hosts share this
    machine's /dev/shm)."""
    for server in cluster.servers:
        with open(f"/dev/shm/{server.shm_name}", "r+b") as fh, \
                mmap.mmap(fh.fileno(), 0) as arena:
            at = arena.find(value[:64])
            if at >= 0:
                arena[at + 100] ^= 0xFF
                return
    raise AssertionError("the value is in no arena")


def test_a_corrupted_value_is_a_checksum_miss_never_wrong_bytes(link):
    """Over TCP always; out of an arena (shm, NIXL) when the client hashes arena reads too
    (``verify_arena_reads``; by default the server's hash at COMMIT stands)."""
    transport, cluster = link
    with Client(cluster.addresses, timeout_s=5.0, transport=transport, token=TOKEN,
                verify_arena_reads=True) as client:
        value, k = data(200_000, 1000 + next(_keys)), key("corrupt")   # no copy elsewhere
        assert client.put(k, value)
        _flip_stored_byte(cluster, value)
        assert client.get(k) is None
        assert client.get_into(k, bytearray(len(value))) is None
        assert client.batch_get([k]) == [None]
        assert client.stats()["misses_by_reason"]["checksum"] == 3
        assert client.put(k, value) and client.get(k) == value      # a rewrite heals it


def test_a_corrupted_value_read_into_a_registered_buffer_is_a_checksum_miss(link):
    """A registered buffer takes NIXL's direct path (one request of ``io_size`` descriptors
    straight into it, no bounce); with ``verify_arena_reads`` the bytes that landed are hashed
    there too. Elsewhere registering is a no-op and the same reads must miss the same way."""
    transport, cluster = link
    with Client(cluster.addresses, timeout_s=5.0, transport=transport, token=TOKEN,
                verify_arena_reads=True) as client:
        value, k = data(3 << 20, 1000 + next(_keys)), key("corrupt-registered")
        outs = [np.zeros(len(value), dtype=np.uint8) for _ in range(2)]
        for out in outs:
            assert client.register_buffer(out) is (transport == "nixl")
        assert client.put(k, value)
        assert client.get_into(k, outs[0]) == len(value)
        assert outs[0].tobytes() == value                  # intact: a hit through the path
        _flip_stored_byte(cluster, value)
        assert client.get_into(k, outs[0]) is None
        assert client.batch_get_into([k, key("absent")], outs) == [None, None]
        assert client.stats()["misses_by_reason"]["checksum"] == 2
        assert client.put(k, value) and client.get_into(k, outs[1]) == len(value)
        assert outs[1].tobytes() == value


def test_an_arena_copy_that_outlived_its_lease_is_hashed_after_all(client, link,
                                                                     monkeypatch):
    """An unhashed arena read is sound only while the lease holds; a copy that ended past
    the lease window is hashed once it has landed: a changed byte is then a checksum miss,
    an intact value still a hit."""
    only(client, "shm", "nixl")
    from gcache.sdk import leases
    original = leases.Extent.__init__

    def expired(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.checksum:                                # leased, not allocated
            object.__setattr__(self, "until_s", 0.0)

    good, bad = data(100_000, 7), data(150_000, 2000 + next(_keys))
    kg, kb = key("late-good"), key("late-bad")
    assert client.put(kg, good) and client.put(kb, bad)
    _flip_stored_byte(link[1], bad)
    monkeypatch.setattr(leases.Extent, "__init__", expired)
    assert client.get(kg) == good and client.batch_get([kg]) == [good]
    assert client.get(kb) is None and client.batch_get([kb]) == [None]
    assert client.stats()["misses_by_reason"]["checksum"] == 2


def test_an_arena_copy_whose_server_went_meanwhile_is_a_miss(link, monkeypatch):
    """A server that closed its end while a value was copied out of its arena may have been
    restarted on that arena and handed the extent to a new value: the copy is a miss."""
    transport, cluster = link
    with Client(cluster.addresses, timeout_s=5.0, transport=transport, token=TOKEN,
                suspect_s=0) as client:              # the second read must not be skipped
        only(client, "shm", "nixl")
        from gcache.transport.stream import StreamConnection
        k = key("gone")
        assert client.put(k, data(50_000, 9))
        monkeypatch.setattr(StreamConnection, "peer_closed", lambda self: True)
        assert client.get(k) is None and client.batch_get([k]) == [None]
        assert client.stats()["misses_by_reason"]["connection_lost"] == 2
        monkeypatch.undo()
        assert client.get(k) == data(50_000, 9)


def test_a_write_past_its_lease_window_is_refused_not_landed(client, monkeypatch):
    """An ALLOC's extent may be written for half the lease TTL; a copy found later than that is
    refused by the client (the server drops the extent at the TTL), put again by the batch,
    and when that is late too, a ``timeout`` miss: nothing of it is ever visible."""
    transport = only(client, "shm", "nixl")
    from gcache.sdk.leases import WriteWindowPassed
    from gcache.sdk.nixl_exchange import NixlExchange
    from gcache.sdk.shm_exchange import ShmExchange
    exchange = {"shm": ShmExchange, "nixl": NixlExchange}[transport]
    original, tries = exchange.copy_in, []

    def late(self, extent, value, landed=None):
        tries.append(extent.handle)
        raise WriteWindowPassed(f"{extent.length}-byte write outlived its lease window")

    k = key("late")
    monkeypatch.setattr(exchange, "copy_in", late)
    assert client.batch_put([k], [data(10_000, 3)]) == [False]
    assert len(set(tries)) == 3                            # three ALLOCs: put twice more
    assert client.stats()["misses_by_reason"]["timeout"] == 1
    monkeypatch.setattr(exchange, "copy_in", original)
    assert client.get(k) is None
    assert client.put(k, data(10_000, 4)) and client.get(k) == data(10_000, 4)


@pytest.mark.parametrize("ahead_bytes", [0, (3 << 20) // 2 + 5, 3 << 20])
def test_a_put_lands_whole_however_far_its_hash_got_during_the_alloc(client, monkeypatch,
                                                                       ahead_bytes):
    """The ALLOC's round trip hashes as much of a value as it lasts (the server's pace); the
    copy then hashes the rest piece by piece and copies what was hashed already as it is."""
    transport = only(client, "shm", "nixl")
    from gcache.sdk.nixl_exchange import NixlExchange
    from gcache.sdk.shm_exchange import ShmExchange
    exchange = {"shm": ShmExchange, "nixl": NixlExchange}[transport]
    original = exchange.copy_in

    def hashed_so_far(self, extent, value, landed=None, *, ahead=None):
        ahead.through(ahead_bytes)
        return original(self, extent, value, landed, ahead=ahead)

    monkeypatch.setattr(exchange, "copy_in", hashed_so_far)
    k, raw = key("ahead"), data(3 << 20, ahead_bytes)
    assert client.put(k, raw) is True
    assert client.get(k) == raw


def test_a_value_that_changes_after_it_was_hashed_is_refused_not_stored(client, monkeypatch):
    """A single put hashes a host value while its ALLOC is in flight: bytes that change once
    they are hashed (here the first byte, hashed before the copy) reach the arena, the server's
    hash of them differs from ours at COMMIT, and the put is a ``checksum`` miss that leaves the
    key as it was."""
    transport = only(client, "shm", "nixl")
    from gcache.sdk.nixl_exchange import NixlExchange
    from gcache.sdk.shm_exchange import ShmExchange
    exchange = {"shm": ShmExchange, "nixl": NixlExchange}[transport]
    original = exchange.copy_in

    def changed_first(self, extent, value, landed=None, *, ahead=None):
        assert ahead is not None, "a host value's hash did not begin with its ALLOC"
        ahead.through(1)              # how far the ALLOC's round trip got is the server's pace
        np.frombuffer(value, dtype=np.uint8, count=1)[0] ^= 0xFF
        return original(self, extent, value, landed, ahead=ahead)

    k, size = key("changed"), SIZES[-1]
    value = np.frombuffer(bytearray(data(size, 5)), dtype=np.uint8)
    client.register_buffer(value)
    try:
        assert client.put(k, data(size, 6)) is True
        monkeypatch.setattr(exchange, "copy_in", changed_first)
        assert client.put(k, value) is False
    finally:
        client.unregister_buffer(value)
    assert client.stats()["misses_by_reason"] == {"checksum": 1}
    monkeypatch.setattr(exchange, "copy_in", original)
    assert client.get(k) == data(size, 6)


def test_a_killed_server_is_a_fast_miss_and_a_restarted_one_is_reached_afresh(link, tmp_path):
    transport, shared = link
    hosts = shared.hosts[:1] if shared.hosts else None
    with LocalCluster(1, memory="64MiB", server_args=SERVER_ARGS, hosts=hosts,
                      log_dir=str(tmp_path)) as cluster, \
            Client(cluster.addresses, timeout_s=2.0, transport=transport, token=TOKEN,
                   suspect_s=0.2) as client:
        k = key("kill")
        assert client.put(k, data(300_000, 9))
        cluster.kill(0)
        started = time.monotonic()
        assert client.get(k) is None and client.put(k, b"x") is False
        assert client.batch_get([k, key()]) == [None, None]
        assert time.monotonic() - started < 8.0           # misses, never a stall
        reasons = client.stats()["misses_by_reason"]
        assert reasons.keys() & {"connection_lost", "unreachable", "suspect", "timeout"}
        cluster.restart(0)
        deadline = time.monotonic() + 10
        while not client.put(k, data(1000, 2)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.get(k) == data(1000, 2)
        assert client.stats()["transports"][cluster.addresses[0]] == transport


# ---- registration -------------------------------------------------------------------------------

def test_a_buffer_is_registered_once_and_reused(client):
    transport = client.config.transport
    k1, k2 = key("reg"), key("reg")
    buffer = np.zeros(2 << 20, dtype=np.uint8)
    registered = client.register_buffer(buffer)
    assert registered is (transport == "nixl")           # a no-op elsewhere
    regions = client.stats()["nixl_regions"]
    assert client.register_buffer(buffer) is registered
    assert client.register_buffer(buffer[4096:8192]) is registered    # inside: no new one
    assert client.stats()["nixl_regions"] == regions
    assert client.put(k1, data(1 << 20, 1)) and client.put(k2, data(2 << 20, 2))
    for _ in range(3):
        assert client.get_into(k1, buffer) == 1 << 20
        assert buffer[:1 << 20].tobytes() == data(1 << 20, 1)
        assert client.get_into(k2, buffer) == 2 << 20
        assert buffer.tobytes() == data(2 << 20, 2)
    buffer[:] = np.frombuffer(data(2 << 20, 5), dtype=np.uint8)
    assert client.put(k1, buffer) and client.get(k1) == data(2 << 20, 5)
    assert client.stats()["nixl_regions"] == regions
    if transport == "nixl":
        assert regions == 2                  # the bounce slots and this buffer


def test_a_registered_buffer_lives_until_it_is_unregistered(client):
    # Memory freed under a registration hands its addresses to the next allocation while the
    # registration still names the old pages: the client keeps what it registered alive.
    transport = client.config.transport
    k = key("unreg")
    assert client.put(k, data(1 << 20, 7))
    buffer = np.zeros(1 << 20, dtype=np.uint8)
    alive = weakref.ref(buffer)
    regions = client.stats()["nixl_regions"]
    assert client.register_buffer(buffer) is (transport == "nixl")
    del buffer
    assert (alive() is not None) is (transport == "nixl")
    if transport != "nixl":
        return
    assert client.get_into(k, alive()) == 1 << 20 and alive().tobytes() == data(1 << 20, 7)
    assert client.unregister_buffer(alive()) is True
    assert client.unregister_buffer(np.zeros(16, dtype=np.uint8)) is False
    assert client.stats()["nixl_regions"] == regions
    assert alive() is None
    for _ in range(3):        # fresh buffers, likely at the freed addresses: through the bounce
        out = np.zeros(1 << 20, dtype=np.uint8)
        assert client.get_into(k, out) == 1 << 20 and out.tobytes() == data(1 << 20, 7)


def test_pinned_staging_buffers_are_registered_while_the_pool_holds_them(cluster_factory):
    # What the vLLM connector's staging does on a GPU host (pin=True there): every buffer the
    # pool makes is registered with the client, so NIXL moves from and to it directly; one the
    # pool drops to make room is unregistered.
    # Here, not in a module of its own: UCX lists interfaces at a process's first agent, and
    # this module's network namespaces must exist by then.
    torch = pytest.importorskip("torch")
    from gcache.transport.pinned import PinnedPool

    cluster = cluster_factory(1, server_args=("--nixl",))
    with Client(cluster.addresses, transport="nixl", timeout_s=5.0) as client:
        pool = PinnedPool(pin=False, cap_bytes=4 << 20, on_new=client.register_buffer,
                          on_drop=client.unregister_buffer)
        value = torch.randint(0, 255, (1 << 20,), dtype=torch.uint8)
        assert client.put("warm", value)                     # the agent exists from here
        before = client.stats()["nixl_regions"]
        staged = pool.take(1 << 20)
        staged.copy_(value)
        assert client.stats()["nixl_regions"] == before + 1
        assert client.put("staged", staged)
        landing = pool.take(1 << 20)
        assert client.get_into("staged", landing) == 1 << 20 and torch.equal(landing, value)
        assert client.stats()["nixl_regions"] == before + 2
        pool.give(staged)
        pool.give(landing)
        big = pool.take(3 << 20)          # a 4 MiB buffer: under the cap only if both go
        assert client.stats()["nixl_regions"] == before + 1   # two dropped, one made
        assert client.get_into("staged", big[:1 << 20]) == 1 << 20
        assert client.stats()["misses_by_reason"] == {}
