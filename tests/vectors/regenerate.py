"""Write the shared conformance vectors (tests/vectors/*.json) from the Python SDK's real code.

The files are data that both SDKs check: ``tests/unit/test_vectors.py`` recomputes every vector
with ``gcache``'s frame, placement, checksum and handshake code, and ``sdk-c``'s
``test_vectors`` with libgcache's; so a change to either side that breaks byte compatibility
fails a test. Run this only when the protocol itself changes (and say so in docs/protocol.md):

    .venv/bin/python tests/vectors/regenerate.py

64-bit values are hex strings (JSON numbers lose them past 2^53); keys and payloads are hex.
"""

from __future__ import annotations

import json
import pathlib

from gcache.frame import (
    FLAG_CHECKSUM_TRAILS,
    FLAG_CONTENT_ADDRESSED,
    FLAG_IN_PLACE,
    FLAG_NO_REPLY,
    FLAG_PINNED,
    GET_ENTRY,
    HEADER,
    LEASE_ENTRY,
    MAGIC,
    PUT_ENTRY,
    VERSION,
    Header,
    Op,
    Status,
    auth_proof,
    encode_keys,
)
from gcache.keys import checksum, key_hash
from gcache.placement import PlacedMap, Placement

HERE = pathlib.Path(__file__).resolve().parent
FIELDS = ("op", "request_id", "status", "flags", "key_len", "count", "payload_len", "handle",
          "offset", "length", "checksum", "group")
WIDE = ("payload_len", "handle", "offset", "length", "checksum", "group")   # u64: hex strings


def pattern(length: int, multiplier: int, offset: int) -> bytes:
    """The bytes ``(i * multiplier + offset) & 0xFF`` for i in range(length)."""
    return bytes((i * multiplier + offset) & 0xFF for i in range(length))


def fields_of(header: Header) -> dict[str, object]:
    out: dict[str, object] = {}
    for name in FIELDS:
        value = int(getattr(header, name))
        out[name] = f"{value:016x}" if name in WIDE else value
    return out


def frames() -> dict[str, object]:
    value = b"abc"
    good = [
        ("GET request for b'k' (docs/protocol.md's example)", Header(Op.GET, 7, key_len=1), b"k",
         b""),
        ("its reply: 3 bytes", Header(Op.GET, 7, payload_len=3, length=3,
                                      checksum=checksum(value)), b"", value),
        ("PUT with the checksum trailing, content-addressed, in a group",
         Header(Op.PUT, 0xFFFFFFFF, flags=FLAG_CHECKSUM_TRAILS | FLAG_CONTENT_ADDRESSED,
                key_len=2, payload_len=3 + 8, group=key_hash(b"g")), b"kk",
         value + checksum(value).to_bytes(8, "little")),
        ("LEASE reply", Header(Op.LEASE, 3, handle=0x0102030405060708, offset=1 << 40,
                               length=4 << 20, checksum=0xFEDCBA9876543210), b"", b""),
        ("ALLOC reply, pinned", Header(Op.ALLOC, 9, flags=FLAG_PINNED, handle=77, offset=4096,
                                       length=1 << 20), b"", b""),
        ("in-place WRITE notice", Header(Op.WRITE, 10, flags=FLAG_IN_PLACE | FLAG_NO_REPLY,
                                         handle=77, offset=1 << 20, length=1 << 20), b"", b""),
        ("RELEASE of two handles, no reply", Header(Op.RELEASE, 11, flags=FLAG_NO_REPLY,
                                                    count=2, payload_len=16),
         b"", (5).to_bytes(8, "little") + (6).to_bytes(8, "little")),
        ("NOT_FOUND reply to DELETE", Header(Op.DELETE, 12, Status.NOT_FOUND), b"", b""),
        ("AUTH_FAILED reply", Header(Op.AUTH, 2, Status.AUTH_FAILED), b"", b""),
        ("HELLO request", Header(Op.HELLO, 1), b"", b""),
        ("LIST", Header(Op.LIST, 13, count=1024), b"", b""),
        ("PREFETCH of two keys, the highest opcode", Header(Op.PREFETCH, 14, count=2),
         b"", b"\x01\x00a\x01\x00b"),
    ]
    max_payload = 1 << 30
    out_good = []
    for name, header, key, payload in good:
        header = header._replace(key_len=len(key), payload_len=len(payload)) \
            if header.op != Op.PUT else header
        out_good.append({"name": name, "header": header.pack().hex(), "fields": fields_of(header),
                         "key": key.hex(), "payload": payload.hex()})

    def raw(**changes: int) -> str:
        base = {"magic": MAGIC, "version": VERSION, "op": int(Op.GET), "flags": 0, "status": 0,
                "request_id": 1, "key_len": 1, "count": 0, "payload_len": 0}
        base.update(changes)
        return HEADER.pack(base["magic"], base["version"], base["op"], base["flags"],
                           base["status"], base["request_id"], base["key_len"], base["count"],
                           base["payload_len"], 0, 0, 0, 0, 0).hex()

    bad = [
        ("wrong magic", raw(magic=0x12345678), "magic"),
        ("version 1", raw(version=1), "version"),
        ("opcode 0", raw(op=0), "opcode"),
        ("opcode 19", raw(op=19), "opcode"),
        ("status 10", raw(status=10), "status"),
        ("key_len 1025", raw(key_len=1025), "key_len"),
        ("payload_len past the limit", raw(payload_len=max_payload + 1), "payload_len"),
    ]
    return {"max_payload": max_payload, "good": out_good,
            "bad": [{"name": n, "header": h, "field": f} for n, h, f in bad]}


def tables() -> dict[str, object]:
    keys = [b"a", b"bc", pattern(300, 7, 1)]
    return {
        "keys": {"keys": [k.hex() for k in keys], "encoded": encode_keys(keys).hex()},
        "get_entries": [{"status": s, "length": f"{n:016x}", "checksum": f"{c:016x}",
                         "encoded": GET_ENTRY.pack(s, n, c).hex()}
                        for s, n, c in ((0, 3, checksum(b"abc")), (1, 0, 0), (3, 0, 0))],
        "put_entries": [{"key_len": k, "length": f"{n:016x}", "checksum": f"{c:016x}",
                         "encoded": PUT_ENTRY.pack(k, n, c).hex()}
                        for k, n, c in ((1, 3, checksum(b"abc")), (1024, 1 << 30, 1))],
        "lease_entries": [{"status": s, "handle": f"{h:016x}", "offset": f"{o:016x}",
                           "length": f"{n:016x}", "checksum": f"{c:016x}",
                           "encoded": LEASE_ENTRY.pack(s, h, o, n, c).hex()}
                          for s, h, o, n, c in ((0, 9, 4096, 3, checksum(b"abc")),
                                                (1, 0, 0, 0, 0), (3, 0, 0, 0, 0))],
    }


def checksums() -> list[dict[str, object]]:
    explicit = [b"", b"abc", b"k", pattern(17, 1, 0), pattern(240, 3, 5)]
    out: list[dict[str, object]] = [{"data": d.hex(), "xxh3_64": f"{checksum(d):016x}"}
                                    for d in explicit]
    for length, multiplier, offset in ((1 << 20, 31, 7), ((4 << 20) + 13, 131, 0),
                                       (256 << 10, 1, 0)):
        data = pattern(length, multiplier, offset)
        out.append({"pattern": {"length": length, "multiplier": multiplier, "offset": offset},
                    "xxh3_64": f"{checksum(data):016x}"})
    return out


def handshake() -> list[dict[str, str]]:
    nonces = [bytes(16), pattern(16, 37, 11), bytes(range(16))]
    tokens = ["secret", "", "t" * 100, "tökén ✓"]
    return [{"token": t, "nonce": n.hex(), "proof": auth_proof(t, n).hex()}
            for t in tokens for n in nonces]


def placement_keys(count: int, tag: str) -> list[bytes]:
    keys = [f"{tag}/page/{i}".encode() for i in range(count)]
    keys += [pattern(1 + i, 29 + i, i) for i in range(0, 40, 7)]   # binary keys
    if tag == "static":
        keys.append(bytes([0xFF]) * 1024)                          # the longest key
    return keys


def ring_case(name: str, members: dict[str, tuple[str, float]], live: list[str] | None,
              vnodes: int, width: int, groups: list[bytes | None]) -> dict[str, object]:
    placed = PlacedMap(members, live, Placement(vnodes=vnodes, group_width=width))
    lookups = []
    for group in groups:
        owners = placed.owners(0 if group is None else key_hash(group))
        for key in placement_keys(24, name):
            lookups.append({"key": key.hex(), "group": None if group is None else group.hex(),
                            "owner": owners(key)})
    slots = [{"group": g.hex(), "owners": [None if s is None else placed.address_of[s]
                                          for s in placed.ring.slot_owners(key_hash(g), width)]}
             for g in groups if g is not None]
    return {"name": name, "vnodes": vnodes, "group_width": width,
            "members": [{"id": sid, "address": address, "weight": weight,
                         "live": live is None or sid in live}
                        for sid, (address, weight) in members.items()],
            "lookups": lookups, "slots": slots}


def placement() -> list[dict[str, object]]:
    static = ["127.0.0.1:7700", "127.0.0.1:7701", "127.0.0.1:7702"]
    groups: list[bytes | None] = [None, b"prefix-root", b"g", "grüppe".encode()]
    cases = [
        ring_case("static", {a: (a, 1.0) for a in static}, None, 256, 2, groups),
        ring_case("map", {"srv-b": ("10.0.0.2:7700", float(2 << 30)),
                          "srv-a": ("10.0.0.1:7700", float(1 << 30)),
                          "srv-c": ("10.0.0.3:7700", float(512 << 20)),
                          "srv-d": ("10.0.0.4:7700", float(3 << 30))},
                  ["srv-a", "srv-b", "srv-d"], 64, 2, groups),
        # 5 * 1 / 2 = 2.5 and 5 * 3 / 2 = 7.5 points: halves round to the even neighbour
        ring_case("half-points", {"x": ("h:1", 1.0), "y": ("h:2", 3.0)}, None, 5, 2, groups),
        ring_case("wider-than-ring", {"p": ("h:1", 1.0), "q": ("h:2", 1.0)}, None, 16, 3,
                  groups),
        ring_case("none-live", {"p": ("h:1", 1.0)}, [], 8, 2, groups[:2]),
        ring_case("empty", {}, None, 256, 2, groups[:2]),
    ]
    return cases


def facts() -> dict[str, list[str]]:
    """HELLO payloads (hex) a client must accept, and ones it must refuse."""
    good = [
        '{"version": 2, "host_id": "0123456789abcdef", "address": "127.0.0.1:7700", '
        '"unix_socket": "/tmp/gcache-7700.sock", "arena_bytes": 67108864, "arena_id": "a1b2", '
        '"io_size": 1048576, "max_value_size": 1073741824, "lease_ttl_ms": 5000, '
        '"parents": true}',
        '{"host_id": null, "unix_socket": "", "nixl": {"metadata": "AAAA", '
        '"arena_address": 140000000000}, "extra": [1, 2.5e3, "\\u00e9\\ud83d\\ude00"]}',
        "{}",
    ]
    bad = ["[]", "null", '"facts"', "{", '{"arena_bytes": -1}', '{"arena_bytes": true}',
           '{"arena_bytes": 1.5}', '{"host_id": 5}', '{"lease_ttl_ms": "5000"}',
           '{"unix_socket": ["/tmp/x"]}', '{"a": 1} trailing']
    return {"good": [g.encode().hex() for g in good],
            "bad": [b.encode().hex() for b in bad] + ["ff"]}


def main() -> None:
    files = {"frames.json": {**frames(), "tables": tables()}, "checksums.json": checksums(),
             "handshake.json": handshake(), "placement.json": placement(), "facts.json": facts()}
    for name, data in files.items():
        (HERE / name).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
