"""vLLM's ``--load-format gcache``: a model's safetensors shards read from GCache by range.

Push the model's directory once (``gcache files push DIR --name NAME``), then start each engine
with the directory's config and tokenizer at ``--model`` (the weights need not be there) and::

    --load-format gcache --model-loader-extra-config '{"gcache_master": "HOST:PORT",
        "gcache_name": "NAME"}'

Registered through vLLM's ``vllm.general_plugins`` entry point (``register``), so every vLLM
process that loads plugins knows the format. The shards named by the directory's
``model.safetensors.index.json`` (else every ``*.safetensors``) are read in segments of whole
chunks by one reader thread, ``gcache_prefetch_mb`` ahead of the tensors being copied into the
model; each tensor is a view of its segment (one that straddles two segments is copied once).
A shard GCache does not have whole (never pushed, evicted, a server lost) is read from the
local directory instead, and the log says which and why; a directory pushed again while it
loads is an error, never a mix of two versions. With ``"gcache_host_cache": true`` chunks are
read from this host's own server first and those read from other hosts are copied there
(``gcache.files`` host cache), so the next engine started on this host loads over shared
memory.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
from collections import deque
from collections.abc import Iterator
from typing import Any

import torch

from gcache.files import (
    DirectoryEntry,
    FileStore,
    Manifest,
    MissingRanges,
    TensorSpan,
    directory_file,
    directory_index,
    host_cache_client,
    read_header,
    read_segments,
)
from gcache.kv import (
    KV_ONLY,
    ConfigError,
    client_from_settings,
    count_setting,
    flag_setting,
    gcache_settings,
)
from gcache_vllm._compat import get_logger

log = get_logger(__name__)

LOAD_FORMAT = "gcache"
SEGMENT_BYTES = 64 << 20
INDEX_FILE = "model.safetensors.index.json"
DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
          "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "F32": torch.float32,
          "I64": torch.int64, "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn,
          "F8_E5M2": torch.float8_e5m2, "U16": torch.uint16, "U32": torch.uint32,
          "U64": torch.uint64}


def register() -> None:
    """vLLM's plugin hook: registers ``--load-format gcache``."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    @register_model_loader(LOAD_FORMAT)
    class GCacheModelLoader(BaseModelLoader):  # type: ignore[misc, valid-type]
        def __init__(self, load_config: Any) -> None:
            super().__init__(load_config)
            self.settings = loader_settings(load_config.model_loader_extra_config)

        def download_model(self, model_config: Any) -> None:
            with client_from_settings(self.settings) as client:
                directory_index(FileStore(client), self.settings["name"])

        def load_weights(self, model: Any, model_config: Any) -> None:
            with client_from_settings(self.settings) as client, \
                    file_store(self.settings, client) as store:
                weights = GCacheWeights(store, self.settings["name"], model_config.model,
                                        prefetch_bytes=self.settings["prefetch_mb"] << 20,
                                        pin_memory=_on_gpu(model))
                loaded = model.load_weights(iter(weights))
            log.info("GCache loader: %s", weights.summary())
            if loaded is not None and model_config.quantization is None:
                missing = {name for name, _ in model.named_parameters()} - set(loaded)
                if missing:
                    raise ValueError(f"weights not loaded from {self.settings['name']!r}: "
                                     f"{sorted(missing)}")


def loader_settings(extra: Any) -> dict[str, Any]:
    """The loader's ``gcache_*`` settings, checked; ``ConfigError`` naming a wrong one."""
    if not isinstance(extra, dict):
        raise ConfigError("model_loader_extra_config", extra, "must be a JSON object of "
                          "gcache_* settings")
    settings = gcache_settings(extra, unused=KV_ONLY)
    foreign = sorted(k for k in extra if not str(k).startswith("gcache_"))
    if foreign:
        raise ConfigError(foreign[0], extra[foreign[0]], "--load-format gcache reads only "
                          "gcache_* settings")
    name = settings.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError("gcache_name", name, "set it to the name the model's directory was "
                          "pushed under (gcache files push DIR --name NAME)")
    settings["prefetch_mb"] = count_setting(settings, "prefetch_mb", 256, minimum=1)
    settings["host_cache"] = flag_setting(settings, "host_cache", False)
    return settings


@contextlib.contextmanager
def file_store(settings: dict[str, Any], client: Any) -> Iterator[FileStore]:
    """The loader's ``FileStore`` over ``client``: with ``host_cache``, through this host's own
    server (none reachable over shared memory: without, and the log says so)."""
    local = host_cache_client(client) if settings["host_cache"] else None
    if settings["host_cache"] and local is None:
        log.warning("GCache loader: no server on this host answers over shared memory; "
                    "reading without a host cache")
    try:
        yield FileStore(client, host_cache=local)
    finally:
        if local is not None:
            local.close()


class GCacheWeights:
    """``(name, tensor)`` of the safetensors shards of directory ``name`` in GCache, in file
    order, falling back to ``local_dir`` shard by shard."""

    def __init__(self, store: FileStore, name: str, local_dir: str, *,
                 prefetch_bytes: int = 256 << 20, segment_bytes: int = SEGMENT_BYTES,
                 pin_memory: bool = False) -> None:
        """``pin_memory``: read into page-locked host memory, for a model on a GPU: its
        parameters' copies then go by DMA, not through a staging copy of CUDA's (PyTorch's
        host allocator caches the blocks, so each segment does not pay the page locking)."""
        self.store, self.name, self.local_dir = store, name, local_dir
        self.prefetch_bytes, self.segment_bytes = prefetch_bytes, segment_bytes
        self.pin_memory = pin_memory
        self.from_gcache: list[str] = []
        self.from_disk: list[str] = []
        self.bytes_read = 0

    def summary(self) -> str:
        return (f"{len(self.from_gcache)} shards ({self.bytes_read / 2**20:.1f} MiB) from "
                f"GCache {self.name!r}, {len(self.from_disk)} from {self.local_dir}"
                + (f": {', '.join(self.from_disk)}" if self.from_disk else ""))

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gcache-load") as pool:
            for path, entry in self._shards():
                manifest = None
                if entry is not None:
                    try:
                        manifest = directory_file(self.store, self.name, entry)
                    except FileNotFoundError as exc:
                        log.warning("GCache loader: %s; reading %s from disk", exc, path)
                if manifest is None:
                    yield from self._from_disk(path, set())
                    continue
                done: set[str] = set()
                try:
                    yield from self._from_gcache(pool, manifest, done)
                    self.from_gcache.append(path)
                except MissingRanges as exc:
                    log.warning("GCache loader: %s; reading the rest of %s from disk", exc, path)
                    yield from self._from_disk(path, done)

    def _shards(self) -> list[tuple[str, DirectoryEntry | None]]:
        """The shards to load and their index entries (None: not in GCache)."""
        try:
            entries = {e.path: e for e in directory_index(self.store, self.name)}
        except FileNotFoundError as exc:
            log.warning("GCache loader: %s; loading every shard from %s", exc, self.local_dir)
            entries = {}
        names: list[str] = []
        if INDEX_FILE in entries:
            raw = bytearray(entries[INDEX_FILE].size)
            self.store.get_file(directory_file(self.store, self.name, entries[INDEX_FILE]), raw)
            names = sorted(set(json.loads(bytes(raw))["weight_map"].values()))
        elif entries:
            names = sorted(p for p in entries if p.endswith(".safetensors") and "/" not in p)
        else:
            local = os.path.join(self.local_dir, INDEX_FILE)
            if os.path.exists(local):
                with open(local) as fh:
                    names = sorted(set(json.load(fh)["weight_map"].values()))
            else:
                names = sorted(p for p in os.listdir(self.local_dir)
                               if p.endswith(".safetensors"))
        if not names:
            raise FileNotFoundError(f"no safetensors shards in GCache {self.name!r} nor in "
                                    f"{self.local_dir}")
        return [(n, entries.get(n)) for n in names]

    def _from_gcache(self, pool: concurrent.futures.ThreadPoolExecutor, manifest: Manifest,
                     done: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
        spans = read_header(self.store, manifest)
        for span in spans:
            if span.start == span.end:
                done.add(span.name)
                yield span.name, torch.empty(span.shape, dtype=DTYPES[span.dtype])
        spans = [s for s in spans if s.start < s.end]
        segments = deque(read_segments(manifest, spans, self.segment_bytes))
        in_flight: deque[tuple[int, int, concurrent.futures.Future[torch.Tensor]]] = deque()
        held = 0
        straddler: torch.Tensor | None = None
        index = 0
        try:
            while segments or in_flight:
                while segments and (not in_flight or held < self.prefetch_bytes):
                    start, end = segments.popleft()
                    in_flight.append((start, end, pool.submit(self._read, manifest, start, end)))
                    held += end - start
                start, end, future = in_flight.popleft()
                segment = future.result()
                held -= end - start
                while index < len(spans) and spans[index].start < end:
                    span = spans[index]
                    if span.start >= start and span.end <= end:
                        tensor = _tensor(segment[span.start - start:span.end - start], span)
                    else:                  # straddles segments: gathered into its own bytes
                        if straddler is None:
                            straddler = torch.empty(span.end - span.start, dtype=torch.uint8,
                                                    pin_memory=self.pin_memory)
                        lo, hi = max(span.start, start), min(span.end, end)
                        straddler[lo - span.start:hi - span.start] = segment[lo - start:hi - start]
                        if span.end > end:
                            break
                        tensor, straddler = _tensor(straddler, span), None
                    done.add(span.name)
                    yield span.name, tensor
                    index += 1
        finally:
            for _, _, future in in_flight:
                future.cancel()

    def _read(self, manifest: Manifest, start: int, end: int) -> torch.Tensor:
        segment = torch.empty(end - start, dtype=torch.uint8, pin_memory=self.pin_memory)
        self.store.read_range(manifest, start, end - start, segment.numpy())
        self.bytes_read += end - start
        return segment

    def _from_disk(self, path: str, done: set[str]) -> Iterator[tuple[str, torch.Tensor]]:
        from safetensors import safe_open
        local = os.path.join(self.local_dir, path)
        if not os.path.exists(local):
            raise FileNotFoundError(f"{path} is neither whole in GCache {self.name!r} nor in "
                                    f"{self.local_dir}")
        self.from_disk.append(path)
        with safe_open(local, framework="pt") as shard:
            for key in shard.keys():
                if key not in done:
                    yield key, shard.get_tensor(key)


def _on_gpu(model: Any) -> bool:
    """Whether ``model``'s parameters live on a GPU (vLLM built it on its target device)."""
    first = next(iter(model.parameters()), None)
    return first is not None and first.device.type == "cuda"


def _tensor(raw: torch.Tensor, span: TensorSpan) -> torch.Tensor:
    """``raw`` bytes as the span's tensor: a view when aligned for its dtype, else a copy."""
    dtype = DTYPES[span.dtype]
    try:
        return raw.view(dtype).reshape(span.shape)
    except RuntimeError:
        return raw.clone().view(dtype).reshape(span.shape)
