"""The SDK: ``Client`` with placement, IO threads, connection pooling and miss accounting."""

from gcache.sdk.client import Client

__all__ = ["Client"]
