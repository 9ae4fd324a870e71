"""Put and read one value through a tier's own calls (ALLOC, write, COMMIT; LEASE, RELEASE)."""

from gcache.keys import checksum
from gcache.server.tier_protocol import Tier


def put(tier: Tier, key: bytes, value: bytes, parent: bytes = b"", *, group: int = 0) -> None:
    handle, _, target = tier.alloc(key, len(value), group=group, parent=parent)
    target[:] = value
    target.release()                  # a view left exported keeps the arena from unmapping
    assert tier.commit(handle, checksum(value))


def read(tier: Tier, key: bytes) -> bytes | None:
    leased = tier.lease(key)
    if leased is None:
        return None
    handle, _, view = leased
    try:
        return bytes(view)
    finally:
        view.release()
        assert tier.release(handle)
