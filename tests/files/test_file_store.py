"""``gcache.files`` on a real local cluster of three servers: safetensors shards pushed and
pulled byte for byte, content addressing, range reads, one version per read while a new one is
pushed, and the exact ranges a killed server takes away."""

import threading

import numpy as np
import pytest
import xxhash
from safetensors.numpy import save_file

from gcache.errors import InvalidRequest
from gcache.files import FileStore, Manifest, MissingRanges, host_cache_client
from gcache.files.file_keys import chunk_key, name_key, replica_group, replica_key
from gcache.sdk import Client
from tests.helpers import wait_until

CHUNK = 256 << 10


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(3, memory="64MiB")


@pytest.fixture
def files(cluster):
    with Client(cluster.addresses, timeout_s=5.0) as client:
        yield FileStore(client, chunk_size=CHUNK)


def shards(folder, count=3, seed=0):
    """Safetensors shards of a made-up model, each a few chunks long."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        tensors = {f"layers.{i}.w{j}": rng.standard_normal((256, 300 + 7 * j), np.float32)
                   for j in range(3)}
        save_file(tensors, str(folder / f"model-{i:05d}-of-{count:05d}.safetensors"))
    return sorted(folder.iterdir())


def test_a_directory_of_shards_pulls_back_byte_identical(files, tmp_path):
    pushed = shards(tmp_path / "model")
    for path in pushed:
        header = path.read_bytes()[:8]
        manifest = files.put_file(f"model/{path.name}", path,
                                  metadata={"header_bytes": int.from_bytes(header, "little")})
        assert manifest.size == path.stat().st_size and len(manifest.chunks) > 2
    out = tmp_path / "pulled"
    out.mkdir()
    for path in pushed:
        got = files.get_file(f"model/{path.name}", out / path.name)
        assert (out / path.name).read_bytes() == path.read_bytes()
        assert got.digest == xxhash.xxh3_128_hexdigest(path.read_bytes())
        assert files.stat(f"model/{path.name}").metadata["header_bytes"] > 0
    buffer = bytearray(pushed[0].stat().st_size)
    files.get_file(f"model/{pushed[0].name}", buffer)
    assert bytes(buffer) == pushed[0].read_bytes()


def test_the_same_bytes_pushed_twice_are_stored_once(files, cluster):
    data = np.random.default_rng(1).integers(0, 256, 5 * CHUNK + 1000, np.uint8).tobytes()

    def stored():
        return sum(s["tier"]["bytes"] for s in files.client.server_stats().values())

    files.put_file("a", data)
    before = stored()
    files.put_file("b", data)
    assert stored() - before < 4096          # a manifest and a name, no chunk
    assert files.stat("a").chunks == files.stat("b").chunks


@pytest.mark.parametrize("offset, length", [
    (0, CHUNK), (CHUNK, 2 * CHUNK), (100, 50), (CHUNK - 10, 20), (3 * CHUNK + 5, 10 * CHUNK),
    (0, 0), (4 * CHUNK, 1)])
def test_a_range_read_returns_exactly_those_bytes(files, offset, length):
    data = np.random.default_rng(2).integers(0, 256, 4 * CHUNK + 333, np.uint8).tobytes()
    files.put_file("ranged", data)
    out = bytearray(length)
    n = files.read_range("ranged", offset, length, out)
    assert n == len(data[offset:offset + length])
    assert bytes(out[:n]) == data[offset:offset + length]


def test_every_read_sees_one_version_while_a_new_one_is_pushed(files):
    versions = [np.random.default_rng(10 + v).integers(0, 256, 6 * CHUNK, np.uint8).tobytes()
                for v in range(2)]
    digests = {xxhash.xxh3_128_hexdigest(v) for v in versions}
    files.put_file("weights", versions[0])
    seen, errors = [], []
    stop = threading.Event()

    def reader():
        out = bytearray(6 * CHUNK)
        while not stop.is_set() and len(seen) < 200:
            try:
                files.get_file("weights", out)
            except MissingRanges as exc:         # an old version's chunk evicted: an error,
                errors.append(exc)               # never a mix
                continue
            seen.append(xxhash.xxh3_128_hexdigest(out))

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for thread in readers:
        thread.start()
    for i in range(6):
        files.put_file("weights", versions[(i + 1) % 2])
    stop.set()
    for thread in readers:
        thread.join(timeout=60)
    assert seen and set(seen) <= digests, "a read mixed two versions"
    assert not errors


def test_a_killed_server_is_reported_as_exactly_the_ranges_it_held(files, cluster):
    data = np.random.default_rng(3).integers(0, 256, 24 * CHUNK + 17, np.uint8).tobytes()
    manifest = files.put_file("big", data)
    for victim in range(3):          # one that holds chunks but neither the name nor manifest
        cluster.kill(victim)
        if files.stat("big") is not None:
            break
        cluster.restart(victim)      # its arena outlives it: what it held comes back
        wait_until(lambda: files.stat("big") is not None, timeout_s=10)
    gone = [i for i, ok in enumerate(files.client.batch_exists(
        [chunk_key(d) for d in manifest.chunks])) if not ok]
    assert 0 < len(gone) < len(manifest.chunks)
    with pytest.raises(MissingRanges) as caught:
        files.get_file("big", bytearray(len(data)))
    expected = [manifest.chunk_span(i) for i in gone]
    covered = [(o, n) for o, n in caught.value.ranges]
    assert sum(n for _, n in covered) == sum(n for _, n in expected)
    for start, length in expected:
        assert any(o <= start and start + length <= o + n for o, n in covered)
    assert "bytes are gone" in str(caught.value)
    # a range away from every lost chunk still reads
    whole = next(i for i in range(len(manifest.chunks)) if i not in gone)
    start, length = manifest.chunk_span(whole)
    out = bytearray(length)
    assert files.read_range("big", start, length, out) == length
    assert bytes(out) == data[start:start + length]


def test_with_two_replicas_a_file_reads_whole_after_any_one_server_is_killed(files, cluster):
    data = np.random.default_rng(4).integers(0, 256, 12 * CHUNK + 5, np.uint8).tobytes()
    manifest = files.put_file("replicated", data, replicas=2)
    assert manifest.replicas == 2 and len(manifest.placements) == len(manifest.chunks)
    for i, digest in enumerate(manifest.chunks):     # every chunk's copies on two servers
        owners = {files.client.owner(chunk_key(digest)),
                  files.client.owner(replica_key(digest, 1),
                                     group=replica_group(digest, 1, manifest.placements[i][0]))}
        assert len(owners) == 2 and None not in owners
    for victim in range(3):
        cluster.kill(victim)
        out = bytearray(len(data))
        assert files.get_file("replicated", out).digest == manifest.digest
        assert bytes(out) == data
        got = bytearray(CHUNK)
        assert files.read_range("replicated", 3 * CHUNK - 7, CHUNK, got) == CHUNK
        assert bytes(got) == data[3 * CHUNK - 7:4 * CHUNK - 7]
        cluster.restart(victim)                  # its arena outlives it: its copies return
        wait_until(lambda: all(files.client.server_stats().values()), timeout_s=10)
    assert files.delete("replicated")
    assert files.stat("replicated") is None       # no copy of the name is left behind


def test_replicas_are_refused_beyond_the_servers(files):
    with pytest.raises(InvalidRequest, match="replicas=4 needs as many servers"):
        files.put_file("too-many", b"x" * 10, replicas=4)
    with pytest.raises(InvalidRequest, match="replicas 0"):
        files.put_file("none", b"x", replicas=0)


def test_fewer_replicas_pushed_later_leave_no_stale_name(files, cluster):
    files.put_file("shrinks", b"old bytes", replicas=3)
    files.put_file("shrinks", b"new bytes", replicas=1)
    holder = files.client.owner(name_key("shrinks"))
    cluster.kill(cluster.addresses.index(holder))
    assert files.stat("shrinks") is None          # not the old version from a stale copy


def test_a_file_read_twice_on_one_host_comes_the_second_time_from_its_own_server(files,
                                                                                  cluster):
    # 24 chunks: where they land follows the ring (the servers' ports), and with 12 none was
    # on this host's server about once in 130 runs ((2/3)**12)
    data = np.random.default_rng(6).integers(0, 256, 24 * CHUNK + 3, np.uint8).tobytes()
    manifest = files.put_file("hot", data)
    local = host_cache_client(files.client)
    assert local is not None            # loopback servers are all on this host: the first
    with local:
        host = local.stats()["servers"][0]
        cached = FileStore(files.client, chunk_size=CHUNK, host_cache=local)
        foreign = [d for d in manifest.chunks if files.client.owner(chunk_key(d)) != host]
        assert 0 < len(foreign) < len(manifest.chunks), (host, len(foreign))
        first = bytearray(len(data))
        cached.get_file(manifest, first)
        assert bytes(first) == data
        hits = local.stats()["hits"]
        for i, address in enumerate(cluster.addresses):   # only this host's server is left
            if address != host:
                cluster.kill(i)
        again = bytearray(len(data))
        cached.get_file(manifest, again)
        assert bytes(again) == data
        assert local.stats()["hits"] - hits == len(foreign)
        with pytest.raises(MissingRanges):               # without the cache they are gone
            files.get_file(manifest, bytearray(len(data)))


def test_unknown_names_and_bad_arguments_are_refused_by_name(files, tmp_path):
    with pytest.raises(FileNotFoundError, match="no file 'nope'"):
        files.get_file("nope", tmp_path / "x")
    assert not (tmp_path / "x.gcache-partial").exists() and not (tmp_path / "x").exists()
    assert files.stat("nope") is None and files.delete("nope") is False
    files.put_file("small", b"0123456789")
    with pytest.raises(InvalidRequest, match="must be >= 0"):
        files.read_range("small", -1, 4, bytearray(4))
    with pytest.raises(InvalidRequest, match="holds 2 bytes"):
        files.get_file("small", bytearray(2))
    with pytest.raises(InvalidRequest, match="empty"):
        files.put_file("", b"x")
    assert files.delete("small") is True and files.stat("small") is None
    with pytest.raises(InvalidRequest, match="not a file manifest"):
        Manifest.from_bytes(b"[1]")
    with pytest.raises(InvalidRequest, match="format None"):
        Manifest.from_bytes(b"{}")


def test_gcache_files_push_pull_prune_rm(cluster, tmp_path):
    import subprocess
    import sys
    pushed = shards(tmp_path / "model", count=2, seed=5)
    (tmp_path / "model" / "sub").mkdir()
    (tmp_path / "model" / "sub" / "config.json").write_text('{"layers": 2}')
    servers = ",".join(cluster.addresses)

    def gcache(*args):
        return subprocess.run([sys.executable, "-m", "gcache.cli", "files", *args, "--servers",
                               servers, "--chunk-size", str(CHUNK), "--quiet"],
                              capture_output=True, text=True, timeout=120)

    done = gcache("push", str(tmp_path / "model"), "--name", "tiny-model", "--replicas", "2")
    assert done.returncode == 0, done.stderr
    assert "pushed 3 files as tiny-model" in done.stdout and "GB/s" in done.stdout
    done = gcache("pull", "tiny-model", str(tmp_path / "pulled"))
    assert done.returncode == 0, done.stderr
    for path in pushed + [tmp_path / "model" / "sub" / "config.json"]:
        relative = path.relative_to(tmp_path / "model")
        assert (tmp_path / "pulled" / relative).read_bytes() == path.read_bytes()
    with Client(cluster.addresses, timeout_s=5.0) as client:
        assert FileStore(client).stat(f"tiny-model/{pushed[0].name}").replicas == 2
    done = gcache("ls", "tiny-model/")
    assert done.returncode == 0, done.stderr
    listed = [line.split()[-1] for line in done.stdout.splitlines()[:-1]]
    assert listed == sorted(f"tiny-model/{p.relative_to(tmp_path / 'model').as_posix()}"
                            for p in pushed + [tmp_path / "model" / "sub" / "config.json"])
    assert done.stdout.splitlines()[-1].startswith("3 files, ")
    assert "directory  tiny-model\n" in gcache("ls").stdout
    (tmp_path / "model" / "sub" / "config.json").write_text('{"layers": 3}')
    (tmp_path / "model" / "sub" / "extra.json").write_text("{}")
    assert gcache("push", str(tmp_path / "model"), "--name", "tiny-model").returncode == 0
    (tmp_path / "model" / "sub" / "extra.json").unlink()       # the next push no longer has it
    assert gcache("push", str(tmp_path / "model"), "--name", "tiny-model").returncode == 0
    done = gcache("prune", "tiny-model")    # two earlier indexes, the first config, two shards
    assert done.returncode == 0, done.stderr
    assert ("pruned tiny-model: 5 earlier versions dropped; removed 1 file(s) its index no "
            "longer lists") in done.stdout
    done = gcache("pull", "tiny-model", str(tmp_path / "pruned"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "pruned" / "sub" / "config.json").read_text() == '{"layers": 3}'
    with Client(cluster.addresses, timeout_s=5.0) as client:     # the kept versions have one
        assert not [k for k in client.list_pinned("file/c/") if b"/r" in k]   # copy each
    done = gcache("rm", "tiny-model")
    assert done.returncode == 0 and "(3 files)" in done.stdout, done.stdout
    done = gcache("pull", "tiny-model", str(tmp_path / "again"))
    assert done.returncode != 0 and "no directory 'tiny-model'" in done.stderr
    assert gcache("ls").stdout.strip() == "0 files, 0 bytes"
    with Client(cluster.addresses, timeout_s=5.0) as client:
        assert client.list_pinned("file/") == []          # chunks, manifests and names gone


def pinned_parts(client):
    return sum(s["tier"]["pinned_objects"] for s in client.server_stats().values())


def test_kv_churn_that_fills_the_arena_does_not_evict_a_pinned_file(files, cluster):
    """Each server's arena is 64 MiB (16 segments of 4 MiB); KV puts of twice the cluster's
    memory turn every arena over, and the file's parts stay: they are put pinned."""
    data = np.random.default_rng(7).integers(0, 256, 24 * CHUNK + 99, np.uint8).tobytes()
    manifest = files.put_file("weights", data)
    parts = pinned_parts(files.client)
    assert parts >= len(manifest.chunks) + 2                   # chunks, manifest, name
    value = b"k" * (1 << 20)
    for batch in range(2 * 3 * 64 // 16):
        keys = [f"kv/{batch}/{i}" for i in range(16)]
        assert all(files.client.batch_put(keys, [value] * 16))
    stats = files.client.server_stats().values()
    assert all(s["tier"]["evicted_segments"] >= 16 for s in stats)   # every arena turned over
    # the segment a server was filling when the file's last part came stays with that part,
    # and the KV values after it in that segment with it (pinned spans are whole); which values
    # those are depends on the ring (the servers' ports), so the early batch asked about is
    # three batches on (about 16 values a server), past any segment a part shares
    assert not any(files.client.batch_exists([f"kv/3/{i}" for i in range(16)]))
    out = bytearray(len(data))
    files.get_file("weights", out)
    assert bytes(out) == data
    assert pinned_parts(files.client) == parts
    assert files.list() == ["weights"] and files.list("w") == ["weights"]
    assert files.list("x") == [] and files.manifests()[0].digest == manifest.digest


def test_delete_frees_the_chunks_no_other_file_names(files):
    rng = np.random.default_rng(8)
    shared = rng.integers(0, 256, 3 * CHUNK, np.uint8).tobytes()
    own = rng.integers(0, 256, 2 * CHUNK, np.uint8).tobytes()
    files.put_file("a", shared + own)
    files.put_file("b", shared)
    files.put_file("a", own + shared + b"v2")              # a second version of a
    assert files.list() == ["a", "b"]
    before = pinned_parts(files.client)
    assert files.delete("a") is True
    assert files.list() == ["b"] and files.stat("a") is None
    out = bytearray(len(shared))
    files.get_file("b", out)                                # b's chunks were kept
    assert bytes(out) == shared
    b = files.stat("b")
    left = {k.decode() for k in files.client.list_pinned("file/")}
    assert {f"file/c/{d}" for d in b.chunks} <= left
    assert not any(k.startswith("file/c/") and k[7:] not in b.chunks for k in left)
    assert len(left) == pinned_parts(files.client) < before
    assert files.delete("a") is False and files.delete_many(["b", "nope"]) == 1
    assert files.client.list_pinned("file/") == []


def test_delete_takes_every_versions_replicas(files):
    """Versions of one name with other replica counts place extra copies of the same chunks:
    a delete takes each version's, whichever version it meets first (six names, so some meet
    the single-copy version first)."""
    rng = np.random.default_rng(9)
    names = [f"r{i}" for i in range(6)]
    for name in names:
        data = rng.integers(0, 256, 2 * CHUNK, np.uint8).tobytes()
        files.put_file(name, data, replicas=1)
        files.put_file(name, data + b"!", replicas=2)
    assert files.delete_many(names) == 6
    assert files.client.list_pinned("file/") == []


def test_prune_drops_earlier_versions_and_only_their_own_chunks(files):
    """Each push leaves the version before it pinned for its readers; a prune takes the
    earlier versions under its prefix and the chunks no kept version names, keeps the current
    ones readable, and touches no other name."""
    rng = np.random.default_rng(10)
    shared, old, new = (rng.integers(0, 256, n * CHUNK, np.uint8).tobytes() for n in (2, 2, 1))
    files.put_file("w/a", shared + old)
    first = files.stat("w/a")
    files.put_file("w/a", shared + new)                 # shares two chunks with the first
    files.put_file("w/b", old)
    files.put_file("w/b", new + b"b2")
    files.put_file("x", shared)                         # outside the prefix
    files.put_file("x", shared + b"x2")
    before = pinned_parts(files.client)
    assert files.prune("w") == 2                        # w/a's first version, w/b's first
    current = {"w/a": shared + new, "w/b": new + b"b2", "x": shared + b"x2"}
    for name, value in current.items():
        out = bytearray(len(value))
        files.get_file(name, out)
        assert bytes(out) == value, name
    kept = {c for name in current for c in files.stat(name).chunks}
    assert {k.decode() for k in files.client.list_pinned("file/c/")} == \
        {f"file/c/{c}" for c in kept}                   # old's two chunks went, nothing else
    assert pinned_parts(files.client) < before
    with pytest.raises(MissingRanges):                  # a reader of w/a's first version
        files.get_file(first, bytearray(first.size))
    assert files.prune("w") == 0
    assert files.prune("") == 1                         # x's first: its chunks are x's now
    assert {k.decode() for k in files.client.list_pinned("file/c/")} == \
        {f"file/c/{c}" for c in kept}


def test_pruning_a_directory_removes_the_files_its_index_dropped_but_not_a_nested_directory(
        files, tmp_path):
    """A push that no longer has a file leaves it stored under the directory's name: prune
    removes it with the earlier versions, and keeps a directory pushed on its own beneath."""
    from gcache.files.directory import directory_index, prune_directory, push_directory
    model, nested = tmp_path / "model", tmp_path / "tokenizer"
    for folder, names in ((model, ("a.json", "b.json")), (nested, ("vocab.json",))):
        folder.mkdir()
        for name in names:
            (folder / name).write_text(f'{{"{name}": 1}}')
    push_directory(files, model, "m")
    push_directory(files, nested, "m/tokenizer")
    (model / "b.json").unlink()
    (model / "a.json").write_text('{"a": 2}')
    push_directory(files, model, "m")
    dropped, removed = prune_directory(files, "m")
    assert removed == ["m/b.json"]
    assert dropped == 2                                  # m's first index, a.json's first
    assert files.list("m/") == ["m/a.json", "m/tokenizer", "m/tokenizer/vocab.json"]
    assert [e.path for e in directory_index(files, "m/tokenizer")] == ["vocab.json"]
    assert prune_directory(files, "m") == (0, [])
    assert prune_directory(files, "m/a.json") == (0, [])   # a file, not a directory
