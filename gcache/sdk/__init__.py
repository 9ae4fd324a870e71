"""The SDK: ``Client`` with placement, IO threads, connection pooling and miss accounting, and
the pinned host staging that copies between a GPU and host memory go through (``PinnedPool``:
the SDK's own for CUDA tensors on TCP links, and an engine connector's)."""

from gcache.prefetched import Prefetched
from gcache.sdk.client import Client
from gcache.sdk.fill import Fill
from gcache.transport.pinned import DONE, PinnedPool, PoolExhausted

__all__ = ["DONE", "Client", "Fill", "PinnedPool", "PoolExhausted", "Prefetched"]
