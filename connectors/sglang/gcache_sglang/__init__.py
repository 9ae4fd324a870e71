"""GCache for SGLang: the L3 storage backend of HiCache (``gcache_sglang.storage``) and the
external cache linker of the unified radix cache (``gcache_sglang.linker``)."""

__all__ = ["GCacheHiCacheStorage", "GCacheLinker"]


def __getattr__(name: str):
    # sglang is imported only when a class is asked for, so the package imports (and reports
    # its version) in an environment without the engine.
    if name == "GCacheHiCacheStorage":
        from gcache_sglang.storage import GCacheHiCacheStorage
        return GCacheHiCacheStorage
    if name == "GCacheLinker":
        from gcache_sglang.linker import GCacheLinker
        return GCacheLinker
    raise AttributeError(name)
