"""The ``gcache.kv`` layout of the model a vLLM engine serves, and its KV groups.

One token of one layer is ``kv heads × (head_size + head_size_v)`` elements of the KV cache
dtype, whichever backend layout vLLM keeps it in (``paged``), which is the layout's bytes per
token when the layout is read with that dtype. The byte order (K and V packed per head) is the
connector's own, so the layout's model name carries ``vllm/``: another engine's
objects for the same model are never read as these. The name also carries the operator's
namespace and the weights' fingerprint (``keyed_model_name``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from gcache.kv import ModelLayout, weights_fingerprint

log = logging.getLogger(f"vllm.{__name__}")


def kv_dtype_name(vllm_config: Any) -> str:
    dtype = vllm_config.cache_config.cache_dtype
    if dtype in (None, "auto"):
        dtype = vllm_config.model_config.dtype
    return str(dtype).removeprefix("torch.")


def keyed_model_name(vllm_config: Any, namespace: str = "") -> str:
    """The model as keys name it: vLLM's model name, the operator's ``gcache_namespace`` and
    the fingerprint of the weights (``gcache.kv.weights_fingerprint``), so new weights under
    the same name never load the old weights' KV."""
    model = vllm_config.model_config.model
    folder = _weights_dir(vllm_config)
    fingerprint = _pushed_weights_fingerprint(vllm_config, folder)
    if fingerprint is None and folder:
        fingerprint = weights_fingerprint(folder)
    if fingerprint is None:
        log.warning("gcache: no safetensors weights found for %s; keys name the model only "
                    "(set a new gcache_namespace when its weights change)", model)
    return (f"vllm/{model}" + (f"|ns:{namespace}" if namespace else "")
            + (f"|weights:{fingerprint}" if fingerprint else ""))


def _pushed_weights_fingerprint(vllm_config: Any, folder: str | None) -> str | None:
    """With ``--load-format gcache`` the weights are the pushed directory's, whatever the local
    folder holds: their content digests (exact, not sampled) and the local ``config.json``.
    None when the loader will read from the local folder (nothing pushed under its name)."""
    load_config = getattr(vllm_config, "load_config", None)
    if getattr(load_config, "load_format", None) != "gcache":
        return None
    import xxhash

    from gcache.files import FileStore, content_digest, directory_index
    from gcache.kv import client_from_settings
    from gcache_vllm.loader import loader_settings
    settings = loader_settings(load_config.model_loader_extra_config)
    with client_from_settings(settings) as client:
        try:
            entries = directory_index(FileStore(client), settings["name"])
        except FileNotFoundError:
            return None
    digest = xxhash.xxh3_128(content_digest(entries, suffix=".safetensors").encode())
    config = os.path.join(folder or "", "config.json")
    if folder and os.path.isfile(config):
        with open(config, "rb") as fh:
            digest.update(fh.read())
    return "gcache:" + digest.hexdigest()


def served_names(vllm_config: Any) -> list[str]:
    """The names clients ask for the model by (``--served-model-name``; the model path when
    none is given)."""
    names = vllm_config.model_config.served_model_name or vllm_config.model_config.model
    return [names] if isinstance(names, str) else list(names)


def _weights_dir(vllm_config: Any) -> str | None:
    """The local folder of the served weights: the model path, or the hub cache's snapshot of
    a hub name (never downloaded here)."""
    model_config = vllm_config.model_config
    if os.path.isdir(model_config.model):
        return model_config.model
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(model_config.model, revision=model_config.revision,
                                 local_files_only=True)
    except Exception:
        return None


def model_layout(vllm_config: Any, tp_rank: int, kv_cache_config: Any = None, *,
                 model: str | None = None) -> ModelLayout:
    """The layout with the KV cache dtype, and with the sliding layers and window that vLLM
    itself uses (its KV cache groups), when known: a model implementation may not follow the
    config's ``layer_types`` (vLLM's gpt-oss slides on even layers whatever the config says),
    and a layer stored as a window tail must be one the engine really keeps only a window of."""
    config = dict(vllm_config.model_config.hf_text_config.to_dict())
    config["torch_dtype"] = kv_dtype_name(vllm_config)
    if kv_cache_config is not None:
        sliding, window = sliding_layers(kv_cache_config)
        for key in ("hybrid_layer_pattern", "sliding_window_pattern", "use_sliding_window"):
            config.pop(key, None)
        config["layer_types"] = ["sliding_attention" if i in sliding else "full_attention"
                                 for i in range(config["num_hidden_layers"])]
        config["sliding_window"] = window
    return ModelLayout.from_config(
        config, page_size=vllm_config.cache_config.block_size, tp_rank=tp_rank,
        tp_size=vllm_config.parallel_config.tensor_parallel_size,
        model=model or f"vllm/{vllm_config.model_config.model}")


def sliding_layers(kv_cache_config: Any) -> tuple[set[int], int | None]:
    """Model layers in sliding-window KV cache groups, and their window (one for all)."""
    from gcache_vllm._compat import layer_index
    layers, windows = set(), set()
    for group in kv_cache_config.kv_cache_groups:
        window = getattr(group.kv_cache_spec, "sliding_window", None)
        if type(group.kv_cache_spec).__name__.startswith("SlidingWindow") and window:
            layers.update(layer_index(name) for name in group.layer_names)
            windows.add(window)
    if len(windows) > 1:
        raise ValueError(f"sliding windows {sorted(windows)} differ between layers; GCache's "
                         "layout has one window")
    return layers, (windows.pop() if windows else None)


def group_of_layers(kv_cache_config: Any) -> dict[str, int]:
    """KV cache group index of every attention layer name."""
    return {name: g for g, group in enumerate(kv_cache_config.kv_cache_groups)
            for name in group.layer_names}


def check_block_sizes(kv_cache_config: Any, page_size: int) -> None:
    """Every group's block must be one GCache page: the page keys are per block."""
    sizes = {getattr(group.kv_cache_spec, "block_size", page_size)
             for group in kv_cache_config.kv_cache_groups}
    if sizes - {page_size}:
        raise ValueError(f"KV cache groups use block sizes {sorted(sizes)}; GCache needs one "
                         f"block size for all groups (the page size, {page_size})")
