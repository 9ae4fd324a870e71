"""Put and read one value through a tier's own calls (ALLOC, write, COMMIT; LEASE, RELEASE)."""

from gcache.keys import checksum
from gcache.server.tier_protocol import Tier, Write


def fill(write: Write, value: bytes, offset: int = 0) -> bool:
    """Write ``value`` into ``write`` at ``offset`` (hashing it when the tier asks)."""
    def copy(view, hasher):
        view[:] = value
        if hasher is not None:
            hasher.update(view)
    return write.receive(offset, len(value), copy)


def written(tier: Tier, key: bytes, value: bytes, **kwargs) -> Write:
    """An ALLOC of ``value``'s size with its bytes in place, not committed yet."""
    write = tier.alloc(key, len(value), **kwargs)
    assert fill(write, value)
    return write


def put(tier: Tier, key: bytes, value: bytes, parent: bytes = b"", *, group: int = 0) -> None:
    assert written(tier, key, value, group=group, parent=parent).commit(checksum(value))


def read(tier: Tier, key: bytes) -> bytes | None:
    lease = tier.lease(key)
    if lease is None:
        return None
    view = lease.view()
    try:
        return bytes(view)
    finally:
        view.release()                # a view left exported keeps the arena from unmapping
        assert lease.release()
