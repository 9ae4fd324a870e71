"""The ``Connection`` seam: a reliable, ordered byte stream to one peer.

Implementations (``tcp`` today; ``shm``'s control socket and ``rdma`` later) move at most
``io_size`` bytes per IO and translate every OSError into the GCache error tree, so layers above
never see a socket exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Connection(Protocol):
    peer: str

    def send(self, frames: Sequence[bytes | memoryview], *, timeout_s: float) -> None:
        """Send every frame in order. Raises IOTimeout or ConnectionLost."""

    def recv_into(self, buf: memoryview, *, timeout_s: float) -> None:
        """Fill all of ``buf``. Raises IOTimeout or ConnectionLost (also on a clean close)."""

    def close(self) -> None:
        """Close; idempotent."""
