"""How format2/ was written: run with PYTHONPATH at a checkout of gcache b4aed2d, the release that
wrote format 2 arenas (it uses that release's own HotTier API, not today's, and its arena lives
in /dev/shm): ``PYTHONPATH=<that checkout> python make_format2.py format2``; then gzip it."""

import hashlib
import json
import os
import shutil
import sys

import xxhash

from gcache.server.tier import HotTier  # that release's: alloc returns (handle, offset, view)

SEG = 64 * 1024
NAME = "gcache-image-v2-tmp"


def value_of(key: bytes, n: int) -> bytes:
    seed = hashlib.sha256(key).digest()
    return (seed * (n // 32 + 1))[:n]


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    tier = HotTier(name=NAME, size_bytes=8 * SEG, segment_size=SEG, prefault=True,
                   lease_ttl_s=5.0)

    def put(key: bytes, n: int, *, data: bytes | None = None, **kwargs) -> bytes:
        data = value_of(key, n) if data is None else data
        handle, _, view = tier.alloc(key, len(data), **kwargs)
        view[:] = data
        view.release()
        assert tier.commit(handle, xxhash.xxh3_64_intdigest(data))
        return data

    expect = {}
    for i in range(12):
        key = f"img/plain/{i:02d}".encode()
        expect[key] = put(key, 3000 + 97 * i)
    expect[b"img/grouped"] = put(b"img/grouped", 1500, group=0x1234567890ABCDEF)
    put(b"img/over", 1000, data=b"old" * 300)
    expect[b"img/over"] = put(b"img/over", 1200, data=b"new" * 400)
    put(b"img/deleted", 800)
    assert tier.delete(b"img/deleted")
    _, _, view = tier.alloc(b"img/pending", 700)          # never committed
    view[:] = b"p" * 700
    view.release()
    expect[b"img/big"] = put(b"img/big", 100 * 1024)
    expect[b"img/" + b"k" * 200] = put(b"img/" + b"k" * 200, 900)
    tier.arena._mmap.flush()
    shutil.copy(f"/dev/shm/{NAME}", os.path.join(out, "gcache-image"))
    os.unlink(f"/dev/shm/{NAME}")
    manifest = {"present": {k.decode(): f"{xxhash.xxh3_64_hexdigest(v)}:{len(v)}"
                            for k, v in expect.items()},
                "absent": ["img/deleted", "img/pending", "img/never"],
                "groups": {"img/grouped": 0x1234567890ABCDEF},
                "segment_size": SEG, "memory": 8 * SEG}
    with open(os.path.join(out, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1])
