import pytest

from gcache.frame import FLAG_CHECKSUM_TRAILS, FLAG_IN_PLACE, Header, Op, Status
from gcache.server.request_rules import Refused, check_request

LIMIT = 1 << 20


@pytest.mark.parametrize("header", [
    Header(Op.GET, key_len=3),
    Header(Op.PUT, key_len=3, payload_len=LIMIT),
    Header(Op.PUT, key_len=3, payload_len=LIMIT + 8, flags=FLAG_CHECKSUM_TRAILS),
    Header(Op.WRITE, payload_len=10, handle=1),
    Header(Op.WRITE, handle=1, length=10, flags=FLAG_IN_PLACE),
    Header(Op.RELEASE, handle=4),
    Header(Op.RELEASE, count=2, payload_len=16),
    Header(Op.EXISTS, count=2, payload_len=8),
    Header(Op.AUTH, payload_len=32),
    Header(Op.HELLO),
    Header(Op.LIST, count=1),
    Header(Op.LIST, key_len=7, payload_len=1024, count=1024),
])
def test_well_formed_requests_pass(header):
    check_request(header, max_value_size=LIMIT)


@pytest.mark.parametrize("header,status,message", [
    (Header(Op.GET), Status.BAD_REQUEST, "GET needs a key"),
    (Header(Op.DELETE, key_len=1, payload_len=5), Status.BAD_REQUEST, "carries no payload"),
    (Header(Op.PUT, key_len=1, payload_len=LIMIT + 1), Status.TOO_LARGE, "exceeds"),
    (Header(Op.PUT, key_len=1, payload_len=LIMIT + 9, flags=FLAG_CHECKSUM_TRAILS),
     Status.TOO_LARGE, "exceeds"),
    (Header(Op.AUTH, payload_len=31), Status.BAD_REQUEST, "the proof is 32"),
    (Header(Op.WRITE, payload_len=4, flags=FLAG_IN_PLACE), Status.BAD_REQUEST, "in-place"),
    (Header(Op.RELEASE, count=2, payload_len=15), Status.BAD_REQUEST, "needs 16"),
    (Header(Op.BATCH_LEASE, count=1, payload_len=2000), Status.BAD_REQUEST, "cannot take"),
    (Header(Op.LIST, count=0), Status.BAD_REQUEST, "needs 1..1024 keys"),
    (Header(Op.LIST, count=1025), Status.BAD_REQUEST, "needs 1..1024 keys"),
    (Header(Op.LIST, count=1, payload_len=1025), Status.BAD_REQUEST, "at most 1024 bytes"),
])
def test_malformed_requests_are_refused_naming_the_rule(header, status, message):
    with pytest.raises(Refused, match=message) as caught:
        check_request(header, max_value_size=LIMIT)
    assert caught.value.status == status
