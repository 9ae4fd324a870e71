"""Safetensors files in GCache read by range: the header, the tensors' spans, and a read plan in
whole chunks (no tensor library here: the engines' loaders make tensors of the bytes).

A safetensors file is an 8-byte little-endian header length, a JSON header naming each tensor's
dtype, shape and byte span in the data that follows, then the data. A loader reads the header
once, then the data in segments of whole chunks (a chunk read twice would cost a second network
read), and cuts tensors out of the segments; a tensor that straddles two segments is the only
one copied.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

from gcache.errors import InvalidRequest
from gcache.files.manifest import Manifest
from gcache.files.store import FileStore

MAX_HEADER_BYTES = 100 << 20       # safetensors' own limit
ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
              "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


@dataclass(frozen=True)
class TensorSpan:
    name: str
    dtype: str                     # safetensors' name (F32, BF16, ...)
    shape: tuple[int, ...]
    start: int                     # byte offsets in the file
    end: int


def read_header(store: FileStore, manifest: Manifest) -> list[TensorSpan]:
    """The tensors of the safetensors file ``manifest``, in file order. ``InvalidRequest``
    naming the file when it is not one."""
    what = manifest.name
    first = bytearray(min(manifest.size, manifest.chunk_size))
    store.read_range(manifest, 0, len(first), first)
    if len(first) < 8:
        raise InvalidRequest(f"{what}: {manifest.size} bytes is too short for safetensors")
    (header_bytes,) = struct.unpack_from("<Q", first)
    data_start = 8 + header_bytes
    if header_bytes > MAX_HEADER_BYTES or data_start > manifest.size:
        raise InvalidRequest(f"{what}: a safetensors header of {header_bytes} bytes in a file "
                             f"of {manifest.size}")
    raw = first
    if data_start > len(first):
        raw = bytearray(data_start)
        store.read_range(manifest, 0, data_start, raw)
    try:
        header = json.loads(bytes(raw[8:data_start]))
        spans = [TensorSpan(name, str(t["dtype"]), tuple(int(d) for d in t["shape"]),
                            data_start + int(t["data_offsets"][0]),
                            data_start + int(t["data_offsets"][1]))
                 for name, t in header.items() if name != "__metadata__"]
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise InvalidRequest(f"{what}: not a safetensors header: {exc}") from exc
    for span in spans:
        item = ITEM_BYTES.get(span.dtype)
        if item is None:
            raise InvalidRequest(f"{what}: tensor {span.name!r} has unknown dtype {span.dtype}")
        if not data_start <= span.start <= span.end <= manifest.size or \
                span.end - span.start != item * math.prod(span.shape):
            raise InvalidRequest(f"{what}: tensor {span.name!r} spans [{span.start}, "
                                 f"{span.end}) for shape {span.shape} of {span.dtype}")
    return sorted(spans, key=lambda s: s.start)


def read_segments(manifest: Manifest, spans: list[TensorSpan],
                  segment_bytes: int) -> list[tuple[int, int]]:
    """(start, end) file spans covering every tensor, each of whole chunks (the last ends at
    the file's end) and of about ``segment_bytes`` (at least one chunk): a read of part of a
    chunk reads it whole, so a chunk in two segments would cross the network twice."""
    if not spans:
        return []
    chunk = manifest.chunk_size
    step = max(1, segment_bytes // chunk) * chunk
    first, last = spans[0].start, max(s.end for s in spans)
    out = []
    edge = first // chunk * chunk
    while edge < last:
        out.append((edge, min(edge + step, manifest.size)))
        edge += step
    return out
