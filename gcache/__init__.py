"""GCache: a distributed KV-cache tier for LLM inference.

``from gcache import Client`` is the SDK. It is resolved lazily so that importing a lower layer
(``gcache.server``, ``gcache.master``) never imports the SDK, as ARCHITECTURE §2 requires.
"""

from typing import Any

__all__ = ["Client"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "Client":
        from gcache.sdk import Client
        return Client
    raise AttributeError(f"module 'gcache' has no attribute {name!r}")
