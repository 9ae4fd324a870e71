"""Where a save reads KV from and a load writes it to: token ranges of one layer.

``KVStore`` addresses KV as ``(layer, start, stop)``: the tokens ``[start, stop)`` of one layer,
token-major, ``layout.layer_bytes_per_token(layer)`` bytes per token. Engines keep KV in paged
caches of their own shapes; a connector implements ``KVSource`` / ``KVSink`` over them and hands
out views, so no bytes are copied on the way to or from the SDK. ``LayerArrays`` does this for
one contiguous token-major array (numpy, a CPU or CUDA torch tensor, anything with the buffer
protocol) per layer, which is what the tests and the trace replay use. A CUDA tensor's views are
of the tensor itself: the SDK moves them with one DMA to or from a same-host server's arena, or
through its pinned staging over TCP.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gcache.buffer import as_bytes
from gcache.errors import InvalidRequest
from gcache.kv.layout import ModelLayout


class KVSource(Protocol):
    def read(self, layer: int, start: int, stop: int) -> Any:
        """The KV of tokens ``[start, stop)`` of ``layer``: a buffer of exactly
        ``(stop - start) * layer_bytes_per_token(layer)`` bytes. For a window tail of an SWA
        layer it may be None: the engine no longer holds those tokens (a sliding window moved
        past them), and that tail is not saved."""


class KVSink(Protocol):
    def write_target(self, layer: int, start: int, stop: int) -> Any:
        """A writable buffer for tokens ``[start, stop)`` of ``layer``, same size rule."""


class LayerArrays:
    """One token-major buffer per layer; both a ``KVSource`` and a ``KVSink``."""

    def __init__(self, layout: ModelLayout, arrays: Mapping[int, Any]) -> None:
        self.layout = layout
        self._views: dict[int, Any] = {}
        for layer, array in arrays.items():
            view = as_bytes(array, writable=False, what=f"layer {layer} buffer")
            if len(view) % layout.layer_bytes_per_token(layer):
                per_token = layout.layer_bytes_per_token(layer)
                raise InvalidRequest(f"layer {layer} buffer is {len(view)} bytes; not a multiple "
                                     f"of its {per_token} bytes per token")
            self._views[layer] = view
        self._arrays = dict(arrays)

    def read(self, layer: int, start: int, stop: int) -> Any:
        return self._slice(self._views, layer, start, stop)

    def write_target(self, layer: int, start: int, stop: int) -> Any:
        writable = {layer: as_bytes(self._arrays[layer], writable=True,
                                    what=f"layer {layer} buffer")} \
            if layer in self._arrays else {}
        return self._slice(writable, layer, start, stop)

    def _slice(self, views: Mapping[int, Any], layer: int, start: int, stop: int) -> Any:
        if layer not in views:
            raise InvalidRequest(f"no buffer for layer {layer}; have {sorted(self._views)}")
        per_token = self.layout.layer_bytes_per_token(layer)
        view = views[layer]
        if not 0 <= start <= stop <= len(view) // per_token:
            raise InvalidRequest(f"tokens [{start}, {stop}) of layer {layer} are outside its "
                                 f"{len(view) // per_token} tokens")
        return view[start * per_token:stop * per_token]
