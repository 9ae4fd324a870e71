"""The shared conformance vectors (tests/vectors/*.json), checked against the Python SDK's own
code: frames and batch tables, checksums, handshake proofs, HELLO facts and ring placements.
libgcache's ``test_vectors`` (sdk-c/tests) checks the same files, so the two SDKs stay
byte-compatible; ``tests/vectors/regenerate.py`` writes them."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from gcache.errors import ProtocolError
from gcache.frame import (
    GET_ENTRY,
    LEASE_ENTRY,
    PUT_ENTRY,
    Header,
    Op,
    Status,
    auth_proof,
    encode_keys,
    unpack_header,
)
from gcache.keys import checksum, key_hash
from gcache.placement import PlacedMap, Placement
from gcache.transport.handshake import parse_facts

VECTORS = pathlib.Path(__file__).resolve().parents[1] / "vectors"


def load(name: str):
    return json.loads((VECTORS / name).read_text())


def pattern(length: int, multiplier: int, offset: int) -> bytes:
    """The bytes ``(i * multiplier + offset) & 0xFF`` for i in range(length)."""
    return ((np.arange(length, dtype=np.uint64) * multiplier + offset) & 0xFF) \
        .astype(np.uint8).tobytes()


def header_of(fields: dict[str, object]) -> Header:
    values = {k: int(str(v), 16) if isinstance(v, str) else int(v) for k, v in fields.items()}
    return Header(Op(values.pop("op")), status=Status(values.pop("status")), **values)


FRAMES = load("frames.json")


@pytest.mark.parametrize("vector", FRAMES["good"], ids=lambda v: v["name"])
def test_frame_vectors_pack_and_unpack_as_written(vector):
    header = header_of(vector["fields"])
    assert header.pack().hex() == vector["header"]
    decoded = unpack_header(bytes.fromhex(vector["header"]), max_payload=FRAMES["max_payload"])
    assert decoded == header
    assert decoded.key_len == len(bytes.fromhex(vector["key"]))


@pytest.mark.parametrize("vector", FRAMES["bad"], ids=lambda v: v["name"])
def test_bad_frame_vectors_are_refused(vector):
    with pytest.raises(ProtocolError):
        unpack_header(bytes.fromhex(vector["header"]), max_payload=FRAMES["max_payload"])


def test_batch_table_vectors():
    tables = FRAMES["tables"]
    keys = [bytes.fromhex(k) for k in tables["keys"]["keys"]]
    assert encode_keys(keys).hex() == tables["keys"]["encoded"]
    for e in tables["get_entries"]:
        packed = GET_ENTRY.pack(e["status"], int(e["length"], 16), int(e["checksum"], 16))
        assert packed.hex() == e["encoded"]
    for e in tables["put_entries"]:
        packed = PUT_ENTRY.pack(e["key_len"], int(e["length"], 16), int(e["checksum"], 16))
        assert packed.hex() == e["encoded"]
    for e in tables["lease_entries"]:
        packed = LEASE_ENTRY.pack(e["status"], *(int(e[f], 16) for f in
                                                 ("handle", "offset", "length", "checksum")))
        assert packed.hex() == e["encoded"]


@pytest.mark.parametrize("vector", load("checksums.json"), ids=lambda v: v["xxh3_64"])
def test_checksum_vectors(vector):
    data = bytes.fromhex(vector["data"]) if "data" in vector else pattern(**vector["pattern"])
    assert f"{checksum(data):016x}" == vector["xxh3_64"]


def test_handshake_proof_vectors():
    for vector in load("handshake.json"):
        proof = auth_proof(vector["token"], bytes.fromhex(vector["nonce"]))
        assert proof.hex() == vector["proof"], vector


def test_hello_fact_vectors():
    facts = load("facts.json")
    for payload in facts["good"]:
        assert isinstance(parse_facts(bytes.fromhex(payload)), dict)
    for payload in facts["bad"]:
        with pytest.raises(ProtocolError):
            parse_facts(bytes.fromhex(payload))


@pytest.mark.parametrize("case", load("placement.json"), ids=lambda c: c["name"])
def test_placement_vectors(case):
    members = {m["id"]: (m["address"], m["weight"]) for m in case["members"]}
    live = [m["id"] for m in case["members"] if m["live"]]
    placed = PlacedMap(members, live, Placement(vnodes=case["vnodes"],
                                                group_width=case["group_width"]))
    for lookup in case["lookups"]:
        group = lookup["group"]
        owners = placed.owners(0 if group is None else key_hash(bytes.fromhex(group)))
        assert owners(bytes.fromhex(lookup["key"])) == lookup["owner"], lookup
    for slot in case["slots"]:
        sids = placed.ring.slot_owners(key_hash(bytes.fromhex(slot["group"])),
                                       case["group_width"])
        assert [None if s is None else placed.address_of[s] for s in sids] == slot["owners"]
