"""Fault scenarios shared by the bounded suite (``tests/fault``) and ``make soak``.

A scenario runs *rounds*: a fresh cluster, clients working on it while faults are injected, then
a verification pass, then teardown. The bounded tests run one short round; the soak repeats
rounds until its time is up and sums the tallies.

Every value embeds its key, a version and the checksum of its body, so every read is verified
by the reader itself, whatever the SDK checked. Each worker owns its keys and keeps, per key,
the set of states a read may legally see: after an acknowledged put only that version, after an
unacknowledged one the previous states or the new version (the server may have committed it
before the crash took the reply), after an acknowledged delete only absence. A read outside
that set is a wrong value; at the end a key whose only legal state is a version that cannot be
read is an acknowledged value lost. Rounds budget their writes so that nothing is evicted, which
is what lets "lost" be held to zero.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import xxhash

from gcache import Client
from gcache.cli.local_cluster import LocalCluster

ABSENT = -1
_PREFIX = struct.Struct("<HQQ")            # key length, version, xxh3_64 of the body


def encode(key: str, version: int, size: int) -> bytes:
    raw = key.encode()
    seed = xxhash.xxh3_128_digest(f"{key}:{version}".encode())
    body = (seed * (size // len(seed) + 1))[:size]
    return _PREFIX.pack(len(raw), version, xxhash.xxh3_64_intdigest(body)) + raw + body


def decode(key: str, blob: bytes) -> int | None:
    """The version a value carries, or None when it is not an intact value of ``key``."""
    raw = key.encode()
    if len(blob) < _PREFIX.size + len(raw):
        return None
    key_len, version, body_sum = _PREFIX.unpack_from(blob)
    body = blob[_PREFIX.size + key_len:]
    if key_len != len(raw) or blob[_PREFIX.size:_PREFIX.size + key_len] != raw:
        return None
    return version if xxhash.xxh3_64_intdigest(body) == body_sum else None


@dataclass
class Tally:
    rounds: int = 0
    ops: int = 0
    puts_acked: int = 0
    puts_failed: int = 0
    reads: int = 0
    hits: int = 0
    deletes: int = 0
    faults: int = 0
    wrong_values: int = 0          # not an intact value of the key, or a state it cannot have
    lost_acked: int = 0            # acknowledged, nothing evicted, not readable at the end
    evicted: int = 0
    misses: Counter = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        for name in ("rounds", "ops", "puts_acked", "puts_failed", "reads", "hits", "deletes",
                     "faults", "wrong_values", "lost_acked", "evicted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.misses.update(other.misses)
        self.notes.extend(other.notes)


class Worker(threading.Thread):
    """Puts, reads and deletes on keys of its own until ``stop``, within ``byte_budget``."""

    def __init__(self, name: str, client: Client, stop: threading.Event, *, keys: int,
                 sizes: tuple[int, int], byte_budget: int, seed: int) -> None:
        super().__init__(name=name, daemon=True)
        self.client, self.stop, self.sizes = client, stop, sizes
        self.byte_budget = byte_budget
        self.keys = [f"{name}/k{i}" for i in range(keys)]
        self.legal: dict[str, set[int]] = {k: {ABSENT} for k in self.keys}
        self.versions: dict[str, int] = dict.fromkeys(self.keys, 0)
        self.rng = random.Random(seed)
        self.tally = Tally()

    def run(self) -> None:
        while not self.stop.is_set():
            key = self.rng.choice(self.keys)
            roll = self.rng.random()
            self.tally.ops += 1
            if roll < 0.45 and self.byte_budget > 0:
                self._write(key)
            elif roll < 0.9 or self.byte_budget <= 0:
                self._lookup(key)
            else:
                self._remove(key)

    def _write(self, key: str) -> None:
        self.versions[key] += 1
        version = self.versions[key]
        value = encode(key, version, self.rng.randint(*self.sizes))
        self.byte_budget -= len(value) + 256
        if self.client.put(key, value):
            self.tally.puts_acked += 1
            self.legal[key] = {version}
        else:
            self.tally.puts_failed += 1
            self.legal[key].add(version)

    def _lookup(self, key: str) -> None:
        self.tally.reads += 1
        absent_before = self._absent()
        blob = self.client.get(key)
        if blob is None and ABSENT not in self.legal[key] and self._absent() > absent_before:
            # The server is up and says an acknowledged value is not there (a value on disk
            # with no room in memory to bring it up is NO_SPACE, never absence).
            self.tally.lost_acked += 1
            self.tally.notes.append(f"lost {key} legal={sorted(self.legal[key])} (read)")
            return
        self.check(key, blob, final=False)

    def _absent(self) -> int:
        return self.client.stats()["misses_by_reason"].get("absent", 0)

    def _remove(self, key: str) -> None:
        self.tally.deletes += 1
        self.byte_budget -= 256                        # its tombstones take arena space too
        if self.client.delete(key):
            self.legal[key] = {ABSENT}
        else:
            self.legal[key].add(ABSENT)

    def check(self, key: str, blob: bytes | None, *, final: bool) -> None:
        if blob is None:
            if final and ABSENT not in self.legal[key]:
                self.tally.lost_acked += 1
                self.tally.notes.append(f"lost {key} legal={sorted(self.legal[key])}")
            return
        self.tally.hits += 1
        version = decode(key, blob)
        if version is None or version not in self.legal[key]:
            self.tally.wrong_values += 1
            self.tally.notes.append(f"wrong {key}: got {version}, legal {sorted(self.legal[key])}")
        elif final:
            self.legal[key] = {version}


def _kill_loop(cluster: LocalCluster, stop: threading.Event, tally: Tally, *,
               every_s: tuple[float, float], seed: int) -> None:
    """SIGKILL (or, one time in three, SIGTERM) a random server and restart it, until stop."""
    rng = random.Random(seed)
    while not stop.wait(rng.uniform(*every_s)):
        index = rng.randrange(len(cluster.servers))
        if rng.random() < 1 / 3:
            cluster.terminate(index)
        else:
            cluster.kill(index)
        tally.faults += 1
        time.sleep(rng.uniform(0.0, 0.3))
        cluster.restart(index)


def crash_under_load(seconds: float, *, cold: bool, log_dir: str, seed: int = 0,
                     workers: int = 3) -> Tally:
    """One round: two servers, ``workers`` clients, servers killed and restarted throughout."""
    memory_mib = 16 if cold else 96
    args = ["--segment-size", "4MiB", "--lease-ttl", "1.0"]
    disk_dirs = []
    if cold:
        for i in range(2):
            disk_dirs.append(os.path.join(log_dir, f"disk{i}"))
            os.makedirs(disk_dirs[-1], exist_ok=True)
    cluster = LocalCluster(2, memory=f"{memory_mib}MiB", server_args=tuple(args),
                           log_dir=log_dir)
    for server, disk in zip(cluster.servers, disk_dirs):
        server.args += ["--disk-dir", disk, "--disk-capacity", "2GiB"]
    tally = Tally(rounds=1)
    # Nothing may be evicted: a hot-only round writes at most half of one server's arena (all
    # of it could land on one server); a cold round may write far more, demoted to disk.
    budget = (256 << 20 if cold else (memory_mib << 20) // 2) // workers
    stop = threading.Event()
    with cluster:
        clients = [Client(cluster.addresses, timeout_s=0.5, suspect_s=0.2) for _ in range(workers)]
        crew = [Worker(f"w{seed}-{n}", c, stop, keys=400, sizes=(100, 24 << 10),
                       byte_budget=budget, seed=seed * 100 + n) for n, c in enumerate(clients)]
        killer = threading.Thread(target=_kill_loop, args=(cluster, stop, tally),
                                  kwargs={"every_s": (1.0, 2.5), "seed": seed}, daemon=True)
        for thread in (*crew, killer):
            thread.start()
        stop.wait(seconds)
        stop.set()
        for thread in (*crew, killer):
            thread.join(60)
        _verify(cluster, crew, tally)
        for client in clients:
            tally.misses.update(client.stats()["misses_by_reason"])
            client.close()
    return tally


def _verify(cluster: LocalCluster, crew: list[Worker], tally: Tally, *,
            reader: Client | None = None) -> None:
    """Every server up; then every key of every worker read once more (by ``reader``, placed
    as the workers place keys) and judged."""
    for index, server in enumerate(cluster.servers):
        if not server.is_running():
            cluster.restart(index)
    with reader or Client(cluster.addresses, timeout_s=5.0) as reader:
        for worker in crew:
            values = reader.batch_get(worker.keys)
            for key, blob in zip(worker.keys, values):
                worker.check(key, blob, final=True)
            tally.add(worker.tally)
        for stats in reader.server_stats().values():
            if stats is None:
                tally.notes.append("a server did not answer STAT at the end")
                continue
            tiers = stats.get("tiers", {})
            tally.evicted += stats["tier"]["evicted_objects"]
            tally.evicted += tiers.get("cold", {}).get("evicted_objects", 0)
            tally.evicted += tiers.get("cold", {}).get("dropped_objects", 0)


def leader_failover(seconds: float, *, log_dir: str, seed: int = 0, token: str) -> Tally:
    """One round: three masters (with a token), two servers, IO throughout, the Raft leader
    killed twice (and restarted). The data path must not notice."""
    from gcache.cli.local_masters import LocalMasters
    from gcache.master_client import MasterClient

    def leader() -> int | None:
        for member in masters.members:
            if not member.is_running():
                continue
            link = MasterClient([member.listen], token=token, timeout_s=1.0)
            try:
                if link.status().is_leader:
                    return member.index
            except Exception:
                continue
            finally:
                link.close()
        return None

    def wait_for(predicate, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.1)
        return False

    tally = Tally(rounds=1)
    env_token = {"GCACHE_TOKEN": token}
    saved = os.environ.get("GCACHE_TOKEN")
    os.environ["GCACHE_TOKEN"] = token                # inherited by the server processes
    try:
        with LocalMasters(3, env=env_token, args=("--heartbeat-interval", "0.5"),
                          log_dir=os.path.join(log_dir, "masters")) as masters, \
                LocalCluster(2, memory="64MiB", master=masters.spec,
                             log_dir=os.path.join(log_dir, "servers")) as cluster:
            if not wait_for(lambda: leader() is not None, 20):
                tally.notes.append("no leader elected")
                return tally
            client = Client(master=masters.spec, token=token, timeout_s=1.0, map_refresh_s=0.2)
            if not wait_for(lambda: len(client.stats()["servers"]) == 2, 20):
                tally.notes.append("the client never saw both servers")
            stop = threading.Event()
            worker = Worker(f"lf{seed}", client, stop, keys=40, sizes=(100, 16 << 10),
                            byte_budget=24 << 20, seed=seed)
            worker.start()
            for _ in range(2):
                stop.wait(seconds / 4)
                old = leader()
                if old is None:
                    continue
                os.kill(masters.members[old].proc.pid, signal.SIGKILL)
                masters.members[old].proc.wait(10)
                tally.faults += 1
                if not wait_for(lambda: leader() not in (None, old), 15):
                    tally.notes.append("no new leader within 15 s")
                stop.wait(seconds / 4)
                masters.restart(old)
            stop.set()
            worker.join(60)
            _verify(cluster, [worker], tally,
                    reader=Client(master=masters.spec, token=token, timeout_s=5.0))
            tally.misses.update(client.stats()["misses_by_reason"])
            client.close()
    finally:
        if saved is None:
            os.environ.pop("GCACHE_TOKEN", None)
        else:
            os.environ["GCACHE_TOKEN"] = saved
    return tally


# ---- corruption: flipped bytes in a stopped server's arena and cold files ----------------------

def _arena_targets(path: str) -> list[tuple[str, int, int]]:
    """(part, offset, length) of every segment header, record header, key and value in an
    arena file, found with the arena's own layout."""
    from gcache.record_layout import ALIGN, SPAN_HEADER_BYTES, value_offset
    from gcache.server.record import RECORD, RECORD_MAGIC
    from gcache.server.span_header import read_span_header
    with open(path, "rb") as fh:
        data = memoryview(fh.read())
    with open(path + ".key", "rb") as fh:
        secret = fh.read()
    segment = 4 << 20
    targets, index = [], 0
    while index * segment < len(data):
        header = read_span_header(data, index * segment, secret)
        if header is None:
            index += 1
            continue
        span, claim, _ = header
        start = index * segment
        targets.append(("segment header", start, SPAN_HEADER_BYTES))
        pos, limit = start + SPAN_HEADER_BYTES, start + span * segment
        while pos + RECORD.size <= limit:
            magic, state, _, key_len, length, _, seq, _, _ = RECORD.unpack_from(data, pos)
            if magic != RECORD_MAGIC or seq <= claim or key_len == 0:
                pos += ALIGN
                continue
            if state == 2:                                   # committed: worth hitting
                targets.append(("record header", pos, RECORD.size))
                targets.append(("key", pos + RECORD.size, key_len))
                if length:
                    targets.append(("value", value_offset(pos, key_len), length))
            pos = (value_offset(pos, key_len) + length + ALIGN - 1) & ~(ALIGN - 1)
        index += span
    return targets


def _cold_targets(folder: str) -> list[tuple[str, str, int, int]]:
    """(part, file, offset, length) of the records in the cold tier's segment files."""
    from gcache.server.cold_segments import RECORD, RECORD_MAGIC
    targets = []
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("seg-") and name.endswith(".dat")):
            continue
        path = os.path.join(folder, name)
        with open(path, "rb") as fh:
            data = fh.read()
        pos = 0
        while pos + RECORD.size <= len(data):
            magic, key_len, length, _, _ = RECORD.unpack_from(data, pos)
            if magic != RECORD_MAGIC:
                break
            targets.append(("cold header", path, pos, RECORD.size))
            targets.append(("cold key", path, pos + RECORD.size, key_len))
            targets.append(("cold value", path, pos + RECORD.size + key_len, length))
            pos += RECORD.size + key_len + length
    return targets


def _flip(path: str, offset: int, rng: random.Random) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ rng.choice((1, 2, 4, 8, 16, 32, 64, 128, 0xFF))]))


def corruption(flips: int, *, log_dir: str, seed: int = 0) -> Tally:
    """One round: values in memory and on disk; then, ``flips`` times, stop the server, flip
    one byte in a part chosen in turn (segment header, record header, key, value, cold file
    header, key, value), restart, and read everything. A flip may cost the record it hits,
    never a wrong value, and never more than one value."""
    rng = random.Random(seed)
    disk = os.path.join(log_dir, "disk")
    os.makedirs(disk, exist_ok=True)
    cluster = LocalCluster(1, memory="16MiB", log_dir=log_dir, server_args=(
        "--segment-size", "4MiB", "--disk-dir", disk, "--disk-capacity", "1GiB"))
    tally = Tally(rounds=1)
    stop = threading.Event()
    with cluster:
        with Client(cluster.addresses, timeout_s=5.0) as client:
            worker = Worker(f"cr{seed}", client, stop, keys=300, sizes=(100, 96 << 10),
                            byte_budget=1 << 40, seed=seed)
            for key in worker.keys:                       # ~14 MiB in memory, more on disk
                worker._write(key)
            worker._write(worker.keys[0])
            readable = {k for k, v in zip(worker.keys, client.batch_get(worker.keys))
                        if v is not None}
        shm = f"/dev/shm/{cluster.servers[0].shm_name}"
        parts = ["segment header", "record header", "key", "value",
                 "cold header", "cold key", "cold value"]
        for n in range(flips):
            cluster.terminate(0)
            part = parts[n % len(parts)]
            if part.startswith("cold"):
                choices = [t for t in _cold_targets(os.path.join(disk, "segments"))
                           if t[0] == part]
                if choices:
                    _, path, offset, length = rng.choice(choices)
                    _flip(path, offset + rng.randrange(length), rng)
            else:
                choices = [t for t in _arena_targets(shm) if t[0] == part]
                if choices:
                    _, offset, length = rng.choice(choices)
                    _flip(shm, offset + rng.randrange(length), rng)
            tally.faults += bool(choices)
            cluster.restart(0)
            with Client(cluster.addresses, timeout_s=5.0) as client:
                values = client.batch_get(worker.keys)
            for key, blob in zip(worker.keys, values):
                tally.reads += 1
                if blob is not None:
                    tally.hits += 1
                    version = decode(key, blob)
                    if version is None or version not in worker.legal[key]:
                        tally.wrong_values += 1
                        tally.notes.append(f"wrong {key} after a flip in {part}")
            now = {k for k, v in zip(worker.keys, values) if v is not None}
            tally.lost_acked = len(readable - now)
        if tally.lost_acked > tally.faults:
            tally.notes.append(f"{tally.lost_acked} values lost to {tally.faults} flips")
    tally.puts_acked = worker.tally.puts_acked
    return tally


# ---- exhaustion: hostile and dying peers around one well-behaved client ----------------------

def _hostile(address: str, stop: threading.Event, kind: str, counts: Counter) -> None:
    """One hostile peer doing ``kind`` over and over until stop (bounded by the caller)."""
    from gcache.frame import Header, Op
    host, port = address.rsplit(":", 1)
    while not stop.is_set():
        try:
            sock = socket.create_connection((host, int(port)), timeout=5)
        except OSError:
            stop.wait(0.1)
            continue
        try:
            if kind == "silent":
                stop.wait(3.0)
            elif kind == "slowloris":
                sock.sendall(Header(Op.PUT, 1, key_len=4, payload_len=2 << 20).pack() + b"slow")
                while not stop.is_set():
                    sock.sendall(b"x")
                    stop.wait(0.2)
            elif kind == "dies_holding":
                sock.sendall(Header(Op.ALLOC, 1, key_len=4, length=1 << 20).pack() + b"dead")
                sock.sendall(Header(Op.LEASE, 2, key_len=6).pack() + b"filler")
                stop.wait(0.05)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            counts[kind] += 1
        except OSError:
            counts[f"{kind}_cut_off"] += 1
        finally:
            sock.close()


def exhaustion(seconds: float, *, log_dir: str, seed: int = 0) -> Tally:
    """One round: a server whose memory is kept full by a filler client, surrounded by silent
    strangers, trickling senders and peers that die holding leases and allocations; a
    well-behaved client alongside must be served throughout (its latencies are reported)."""
    cluster = LocalCluster(1, memory="32MiB", log_dir=log_dir, server_args=(
        "--segment-size", "4MiB", "--lease-ttl", "1.0", "--io-timeout", "2",
        "--auth-timeout", "1", "--max-unauthenticated", "16", "--max-connections", "64"))
    tally = Tally(rounds=1)
    stop, counts = threading.Event(), Counter()
    latencies: list[float] = []
    with cluster:
        address = cluster.addresses[0]
        peers = [threading.Thread(target=_hostile, args=(address, stop, kind, counts),
                                  daemon=True)
                 for kind in ["silent"] * 24 + ["slowloris"] * 3 + ["dies_holding"] * 2]

        def fill() -> None:
            with Client([address], timeout_s=2.0) as filler:
                n = 0
                while not stop.wait(0.05):                  # ~20 MiB/s: the arena turns over
                    filler.put("filler" if n % 8 == 0 else f"fill{n}", b"F" * (1 << 20))
                    n += 1

        threads = [*peers, threading.Thread(target=fill, daemon=True)]
        for thread in threads:
            thread.start()
        rng = random.Random(seed)
        with Client([address], timeout_s=2.0) as client:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                key = f"legit{rng.randrange(1 << 30)}"
                value = encode(key, 1, rng.randint(100, 64 << 10))
                started = time.perf_counter()
                ok = client.put(key, value)
                acked = time.perf_counter()
                blob = client.get(key) if ok else None
                latencies.append(time.perf_counter() - started)
                tally.ops += 1
                tally.puts_acked += ok
                tally.puts_failed += not ok
                tally.reads += ok
                if blob is not None:
                    tally.hits += 1
                    if decode(key, blob) != 1:
                        tally.wrong_values += 1
                elif ok:
                    tally.lost_acked += 1           # read at once: not yet evictable
                    tally.notes.append(f"{key} ({len(value)} bytes) absent "
                                       f"{(time.perf_counter() - acked) * 1e3:.1f} ms after "
                                       f"its put was acknowledged")
            tally.misses.update(client.stats()["misses_by_reason"])
            # for the notes only: a STAT that did not answer fails nothing
            tier = (client.server_stats().get(address) or {}).get("tier", {})
            tally.notes.append(f"server: young_spans_reclaimed="
                               f"{tier.get('young_spans_reclaimed')} "
                               f"pin_waits_expired={tier.get('pin_waits_expired')} "
                               f"evicted_segments={tier.get('evicted_segments')}")
        stop.set()
        for thread in threads:
            thread.join(10)
    tally.faults = sum(v for k, v in counts.items() if not k.endswith("_cut_off"))
    latencies.sort()
    if latencies:
        tally.notes.append(f"legit put+get p50={latencies[len(latencies) // 2] * 1e3:.1f}ms "
                           f"p99={latencies[int(len(latencies) * 0.99)] * 1e3:.1f}ms "
                           f"hostile={dict(counts)}")
    return tally
