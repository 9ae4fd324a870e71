"""The one outcome table: every wire status has one meaning, the same to codec and SDK."""

import pytest

from gcache.errors import (
    AuthFailed,
    ChecksumMismatch,
    ConnectFailed,
    ConnectionLost,
    IOTimeout,
    NoSpace,
    ProtocolError,
    ServerError,
)
from gcache.frame import Header, Op, Status
from gcache.outcomes import STATUSES, error_miss, raise_unless_answer, status_miss
from gcache.sdk.metrics import MISS_REASONS


def test_every_status_has_one_outcome_and_a_known_miss_reason():
    assert set(STATUSES) == set(Status)
    assert {o.miss for o in STATUSES.values() if o.miss} <= set(MISS_REASONS)


@pytest.mark.parametrize("op", list(Op))
@pytest.mark.parametrize("status", [Status.NO_SPACE, Status.CHECKSUM_MISMATCH])
def test_no_space_and_a_refused_checksum_answer_single_key_calls_and_fail_the_rest(op, status):
    answered = {Status.NO_SPACE: {Op.PUT, Op.ALLOC, Op.COMMIT, Op.GET, Op.LEASE},
                Status.CHECKSUM_MISMATCH: {Op.PUT, Op.ALLOC, Op.COMMIT}}[status]
    header = Header(op, status=status)
    if op in answered:
        raise_unless_answer(header, op.name)
    else:
        with pytest.raises(NoSpace if status == Status.NO_SPACE else ChecksumMismatch):
            raise_unless_answer(header, op.name)


@pytest.mark.parametrize("status", [Status.AUTH_REQUIRED, Status.AUTH_FAILED,
                                    Status.BAD_REQUEST, Status.INTERNAL])
def test_refusals_fail_every_call(status):
    for op in Op:
        with pytest.raises(ServerError):
            raise_unless_answer(Header(op, status=status), op.name)


@pytest.mark.parametrize("exc, reason", [
    (AuthFailed(), "auth"), (IOTimeout(), "timeout"), (ConnectFailed(), "unreachable"),
    (ConnectionLost(), "connection_lost"), (ProtocolError(), "protocol"),
    (ServerError("INTERNAL"), "server_error"), (NoSpace(), "server_error"),
])
def test_each_exchange_error_is_one_miss_reason(exc, reason):
    assert error_miss(exc) == reason


def test_statuses_that_make_a_call_miss_name_their_reason():
    assert [status_miss(s) for s in (Status.NOT_FOUND, Status.NO_SPACE,
                                     Status.CHECKSUM_MISMATCH)] == ["absent", "no_space",
                                                                    "checksum"]
