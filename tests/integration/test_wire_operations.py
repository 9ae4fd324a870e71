"""The server's ALLOC/WRITE/COMMIT and LEASE/READ/RELEASE operations, driven over a raw channel."""

import pytest

from gcache.errors import InvalidRequest
from gcache.frame import FLAG_CHECKSUM_TRAILS, TRAILER, Op, Status
from gcache.keys import checksum
from gcache.sdk import protocol
from gcache.sdk.protocol import Channel
from gcache.transport.tcp import connect


@pytest.fixture
def channel(shared_cluster):
    conn = connect(shared_cluster.addresses[0], timeout_s=2.0, io_size=1 << 20)
    yield Channel(conn, timeout_s=2.0)
    conn.close()


def call(ch: Channel, op: Op, **kw):
    return ch.reply(ch.request(op, **kw))


def test_alloc_write_commit_makes_a_value_visible_only_at_commit(channel):
    value = bytes(range(256)) * 16
    alloc = call(channel, Op.ALLOC, key=b"wire/a", length=len(value))
    assert alloc.status == Status.OK and alloc.handle > 0
    for offset in range(0, len(value), 1024):
        reply = call(channel, Op.WRITE, payload=(value[offset:offset + 1024],),
                     handle=alloc.handle, offset=offset)
        assert reply.status == Status.OK
    assert call(channel, Op.GET, key=b"wire/a").status == Status.NOT_FOUND
    committed = call(channel, Op.COMMIT, handle=alloc.handle, checksum=checksum(value))
    assert committed.status == Status.OK
    _, reply = protocol.get_length(channel, b"wire/a")
    assert bytes(channel.payload(reply)) == value


def test_commit_with_a_wrong_checksum_is_rejected_and_invisible(channel):
    alloc = call(channel, Op.ALLOC, key=b"wire/bad", length=4)
    call(channel, Op.WRITE, payload=(b"abcd",), handle=alloc.handle, offset=0)
    reply = call(channel, Op.COMMIT, handle=alloc.handle, checksum=checksum(b"abce"))
    assert reply.status == Status.CHECKSUM_MISMATCH
    assert call(channel, Op.GET, key=b"wire/bad").status == Status.NOT_FOUND


def test_put_frame_with_a_wrong_checksum_is_rejected(channel):
    reply = call(channel, Op.PUT, key=b"wire/put-bad", payload=(b"data",), checksum=12345)
    assert reply.status == Status.CHECKSUM_MISMATCH
    assert call(channel, Op.GET, key=b"wire/put-bad").status == Status.NOT_FOUND


def test_put_with_a_trailing_checksum(channel):
    value = b"trailing" * 100
    header = channel.header(Op.PUT, key=b"wire/trail", payload_len=len(value) + 8,
                            flags=FLAG_CHECKSUM_TRAILS)
    channel.conn.send((header.pack(), b"wire/trail", value, TRAILER.pack(checksum(value))),
                      timeout_s=2)
    assert channel.reply(header).status == Status.OK
    bad = channel.header(Op.PUT, key=b"wire/trail2", payload_len=len(value) + 8,
                         flags=FLAG_CHECKSUM_TRAILS)
    channel.conn.send((bad.pack(), b"wire/trail2", value, TRAILER.pack(1)), timeout_s=2)
    assert channel.reply(bad).status == Status.CHECKSUM_MISMATCH
    assert call(channel, Op.GET, key=b"wire/trail2").status == Status.NOT_FOUND
    _, reply = protocol.get_length(channel, b"wire/trail")
    assert bytes(channel.payload(reply)) == value


def test_lease_read_release(channel):
    value = b"0123456789" * 1000
    assert protocol.put(channel, b"wire/lease", memoryview(value), io_size=1 << 20) == Status.OK
    lease = call(channel, Op.LEASE, key=b"wire/lease")
    assert lease.status == Status.OK and lease.length == len(value)
    assert lease.checksum == checksum(value)
    read = call(channel, Op.READ, handle=lease.handle, offset=10, length=20)
    assert bytes(channel.payload(read)) == value[10:30]
    assert call(channel, Op.READ, handle=lease.handle, offset=9990, length=20).status == \
        Status.BAD_REQUEST
    assert call(channel, Op.RELEASE, handle=lease.handle).status == Status.OK
    assert call(channel, Op.RELEASE, handle=lease.handle).status == Status.UNKNOWN_HANDLE
    assert call(channel, Op.READ, handle=lease.handle, offset=0, length=1).status == \
        Status.UNKNOWN_HANDLE


def test_unknown_handles_and_overruns_are_errors_that_keep_the_connection(channel):
    assert call(channel, Op.WRITE, payload=(b"xx",), handle=999999, offset=0).status == \
        Status.UNKNOWN_HANDLE
    assert call(channel, Op.COMMIT, handle=999999, checksum=0).status == Status.UNKNOWN_HANDLE
    alloc = call(channel, Op.ALLOC, key=b"wire/over", length=4)
    assert call(channel, Op.WRITE, payload=(b"12345",), handle=alloc.handle,
                offset=0).status == Status.UNKNOWN_HANDLE
    assert call(channel, Op.ALLOC, key=b"wire/zero", length=0).status == Status.BAD_REQUEST
    assert protocol.stat(channel)["tier"]["objects"] >= 0         # still in sync


def test_stat_reports_the_tier(channel):
    stats = protocol.stat(channel)
    assert stats["tier"]["capacity_bytes"] == 512 << 20
    assert stats["server"]["io_size"] == 1 << 20


def test_check_fits_names_both_sizes():
    with pytest.raises(InvalidRequest, match="out is 3 bytes; the value is 4 bytes"):
        protocol.check_fits(3, 4, "out")
