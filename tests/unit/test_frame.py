import pytest

from gcache.errors import ChecksumMismatch, NoSpace, ProtocolError, ServerError
from gcache.frame import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    PARENT_MAX,
    VERSION,
    Header,
    Op,
    Status,
    decode_keys,
    encode_keys,
    split_parent,
    unpack_header,
    with_parent,
)
from gcache.outcomes import raise_for_status

LIMIT = 1 << 30


def test_header_round_trips_every_field():
    header = Header(Op.READ, 7, Status.OK, 1, 3, 2, 4096, 99, 1 << 33, 1 << 20, 0xDEADBEEF,
                    0xFEEDFACE)
    assert HEADER_SIZE == 64 and VERSION == 2
    assert unpack_header(header.pack(), max_payload=LIMIT) == header


@pytest.mark.parametrize("field,value,message", [
    (0, 0x12345678, "magic"),
    (1, VERSION + 1, "version"),
    (2, 200, "unknown opcode"),
    (6, 1025, "key_len"),
    (8, 1 << 40, "payload_len"),
])
def test_bad_headers_are_refused_naming_the_field(field, value, message):
    fields = [MAGIC, VERSION, Op.GET, 0, 0, 1, 3, 0, 0, 0, 0, 0, 0, 0]
    fields[field] = value
    with pytest.raises(ProtocolError, match=message):
        unpack_header(HEADER.pack(*fields), max_payload=LIMIT)


def test_truncated_header_is_refused():
    with pytest.raises(ProtocolError, match="header is 10 bytes"):
        unpack_header(b"x" * 10, max_payload=LIMIT)


def test_key_lists_round_trip():
    keys = [b"a", b"b" * 1024, "ключ".encode()]
    assert decode_keys(encode_keys(keys), 3) == keys


@pytest.mark.parametrize("payload,count,message", [
    (encode_keys([b"a"]), 2, "ends after"),
    (encode_keys([b"a"]) + b"zz", 1, "trailing"),
    (b"\x00\x00", 1, "declares 0 bytes"),
    (b"\x05\x00ab", 1, "inside the payload"),
])
def test_malformed_key_lists_are_refused(payload, count, message):
    with pytest.raises(ProtocolError, match=message):
        decode_keys(payload, count)


@pytest.mark.parametrize("status,error", [
    (Status.NO_SPACE, NoSpace), (Status.CHECKSUM_MISMATCH, ChecksumMismatch),
    (Status.BAD_REQUEST, ServerError), (Status.TOO_LARGE, ServerError),
    (Status.INTERNAL, ServerError), (Status.UNKNOWN_HANDLE, ServerError),
])
def test_each_failure_status_maps_to_one_exception(status, error):
    with pytest.raises(error):
        raise_for_status(Header(Op.GET, status=status), "GET")


def test_ok_and_not_found_are_not_failures():
    raise_for_status(Header(Op.GET, status=Status.OK), "GET")
    raise_for_status(Header(Op.GET, status=Status.NOT_FOUND), "GET")


def test_a_parent_rides_at_the_end_of_the_key_field_with_its_length():
    assert split_parent(with_parent(b"kv/page/f3", b"kv/prev/f3")) == (b"kv/page/f3",
                                                                       b"kv/prev/f3")
    assert split_parent(with_parent(b"k", b"")) == (b"k", b"")
    assert split_parent(with_parent(b"k", b"p" * PARENT_MAX))[1] == b"p" * PARENT_MAX
    with pytest.raises(ProtocolError, match="64 bytes; at most 63"):
        with_parent(b"k", b"p" * 64)
    for field in (b"", b"\x00", b"k\x02", b"k" * 80 + b"\x40"):
        with pytest.raises(ProtocolError, match="FLAG_PARENT key field"):
            split_parent(field)
