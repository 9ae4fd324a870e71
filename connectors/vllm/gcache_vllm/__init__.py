"""GCache as a vLLM KV connector (``gcache_vllm.connector.GCacheConnector``)."""

__all__ = ["GCacheConnector"]


def __getattr__(name: str):
    # vllm is imported only when the connector class is asked for.
    if name == "GCacheConnector":
        from gcache_vllm.connector import GCacheConnector
        return GCacheConnector
    raise AttributeError(name)
