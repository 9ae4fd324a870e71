"""The data server: hot tier over a shared-memory arena, request handling, ``gcache-server``."""

from gcache.server.daemon import DataServer
from gcache.server.tier import HotTier

__all__ = ["DataServer", "HotTier"]
