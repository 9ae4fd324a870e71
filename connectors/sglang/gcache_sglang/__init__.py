"""GCache as the L3 storage backend of SGLang's HiCache (``gcache_sglang.storage``)."""

__all__ = ["GCacheHiCacheStorage"]


def __getattr__(name: str):
    # sglang is imported only when the backend class is asked for, so the package imports
    # (and reports its version) in an environment without the engine.
    if name == "GCacheHiCacheStorage":
        from gcache_sglang.storage import GCacheHiCacheStorage
        return GCacheHiCacheStorage
    raise AttributeError(name)
