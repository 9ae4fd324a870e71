"""How format3/ was written: run with PYTHONPATH at a checkout of gcache 116b6db, the release that
wrote format 3 arenas (it uses that release's own HotTier API, not today's):
``PYTHONPATH=<that checkout> python make_format3.py format3``; then gzip the arena file."""

import hashlib
import json
import os
import sys

import xxhash

from gcache.server.tier import HotTier  # that release's: alloc returns (handle, offset, view)

SEG = 64 * 1024


def value_of(key: bytes, n: int) -> bytes:
    seed = hashlib.sha256(key).digest()
    return (seed * (n // 32 + 1))[:n]


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    tier = HotTier(name="gcache-image", size_bytes=8 * SEG, segment_size=SEG, prefault=True,
                   lease_ttl_s=5.0, arena_dir=out, pin_budget_bytes=4 * SEG)

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
    expect[b"img/parent"] = put(b"img/parent", 2048)
    expect[b"img/child"] = put(b"img/child", 2048, parent=b"img/parent")
    expect[b"img/grouped"] = put(b"img/grouped", 1500, group=0x1234567890ABCDEF)
    expect[b"img/pinned"] = put(b"img/pinned", 5000, pinned=True)
    put(b"img/over", 1000, data=b"old" * 300)
    expect[b"img/over"] = put(b"img/over", 1200, data=b"new" * 400)
    put(b"img/deleted", 800)
    assert tier.delete(b"img/deleted")
    _, _, view = tier.alloc(b"img/pending", 700)          # never committed
    view[:] = b"p" * 700
    view.release()
    expect[b"img/big"] = put(b"img/big", 100 * 1024)
    expect[b"img/" + b"k" * 200] = put(b"img/" + b"k" * 200, 900)
    tier.close(unlink=False)
    manifest = {"present": {k.decode(): f"{xxhash.xxh3_64_hexdigest(v)}:{len(v)}"
                            for k, v in expect.items()},
                "absent": ["img/deleted", "img/pending", "img/never"],
                "pinned": ["img/pinned"], "parents": {"img/child": "img/parent"},
                "groups": {"img/grouped": 0x1234567890ABCDEF},
                "segment_size": SEG, "memory": 8 * SEG}
    with open(os.path.join(out, "manifest.json"), "w") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1])
