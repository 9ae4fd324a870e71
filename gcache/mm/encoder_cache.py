"""``EncoderCache``: encoder outputs (a media item's embeddings) stored once for the cluster.

A key names everything the output depends on: the media's content hash, the encoder (model and
weights fingerprint: ``encoder``), the preprocessing (resolution, patch size, frame sampling,
dtype...: ``preprocessing``) and a ``namespace`` for tenants. Equal keys therefore mean equal
outputs, and the values are put content addressed; a changed preprocessing parameter is
another key, a miss.

A value is the tensor's bytes (``mm/<digest>/v``) beside a descriptor of its dtype and shape
(``mm/<digest>/d``), both placed by the digest, so one server holds the pair and one request
reads both: ``get_into`` reads the bytes straight into the caller's tensor (host or GPU: the
SDK copies to device memory itself), and the descriptor read with them checks they are of that
dtype and shape; a value of another shape is a miss, never a wrong tensor. ``get`` reads the
descriptor first, then the bytes into a tensor it allocates. Failures are misses, as
everywhere in the SDK: a dead server costs an encoder run, never an exception.

Values may also be plain host buffers (anything with the buffer protocol: an engine's pool
pages by address, as SGLang hands them), recorded as ``uint8`` of their length.

torch is imported only by the methods that make tensors (``get``): a caller passing tensors
has it already.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import xxhash

from gcache.buffer import BufferLike, as_bytes, is_tensor, nbytes
from gcache.errors import InvalidRequest
from gcache.sdk import Client

KEY_VERSION = "gcache.mm/1"
DESCRIPTOR_BYTES = 512          # a descriptor's JSON is far shorter; longer is not ours


class EncoderOutput(NamedTuple):
    """What a stored encoder output is: its dtype (torch's name without ``torch.``) and
    shape."""

    dtype: str
    shape: tuple[int, ...]

    def to_bytes(self) -> bytes:
        return json.dumps({"dtype": self.dtype, "shape": list(self.shape)}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes | bytearray | memoryview) -> EncoderOutput | None:
        """None for bytes that are not a descriptor."""
        try:
            found = json.loads(bytes(raw))
            return cls(str(found["dtype"]), tuple(int(n) for n in found["shape"]))
        except (ValueError, KeyError, TypeError):
            return None

    @classmethod
    def of(cls, value: BufferLike) -> EncoderOutput:
        """A tensor's dtype and shape; a plain buffer's length, as ``uint8``."""
        if is_tensor(value):
            return cls(str(value.dtype).removeprefix("torch."), tuple(value.shape))
        return cls("uint8", (_size(value),))


class EncoderCache:
    def __init__(self, client: Client, *, encoder: str, namespace: str = "") -> None:
        """``encoder``: the encoder's identity, its model name and weights fingerprint (two
        encoders with the same name and other weights must not share outputs)."""
        if not encoder:
            raise InvalidRequest("encoder is empty: name the model and its weights")
        self.client, self.encoder, self.namespace = client, encoder, namespace

    def key(self, media_hash: str, preprocessing: Mapping[str, Any] | None = None) -> str:
        """The key of ``media_hash``'s output under this encoder and ``preprocessing`` (any
        JSON-able settings; their order does not matter)."""
        if not media_hash:
            raise InvalidRequest("media_hash is empty")
        try:
            settings = json.dumps(dict(preprocessing or {}), sort_keys=True, default=str)
        except (TypeError, ValueError) as exc:
            raise InvalidRequest(f"preprocessing cannot be written as JSON: {exc}") from exc
        named = json.dumps([KEY_VERSION, self.namespace, self.encoder, media_hash, settings])
        return "mm/" + xxhash.xxh3_128_hexdigest(named.encode())

    # ---- writes ---------------------------------------------------------------------------------

    def put(self, key: str, tensor: Any) -> bool:
        """Store ``tensor`` (contiguous, host or GPU; or a host buffer) under ``key``; False
        when it could not be stored."""
        return self.put_many([key], [tensor])[0]

    def put_many(self, keys: Sequence[str], tensors: Sequence[Any]) -> list[bool]:
        if len(keys) != len(tensors):
            raise InvalidRequest(f"put_many got {len(keys)} keys and {len(tensors)} tensors")
        names, values, groups = [], [], []
        for key, tensor in zip(keys, tensors, strict=True):
            if (is_tensor(tensor) and not tensor.is_contiguous()) or _size(tensor) == 0:
                raise InvalidRequest(f"the tensor for {key} is empty or not contiguous")
            # the bytes first: a reader who finds the descriptor finds them too
            names += [_value(key), _descriptor(key)]
            values += [as_bytes(tensor, writable=False), EncoderOutput.of(tensor).to_bytes()]
            groups += [key, key]
        stored = self.client.batch_put(names, values, group=groups, content_addressed=True)
        return [stored[2 * i] and stored[2 * i + 1] for i in range(len(keys))]

    # ---- reads ----------------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.exists_many([key])[0]

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        """Whether each output is stored (for scheduling: an encoder run it may skip)."""
        found = self.client.batch_exists([k for key in keys for k in (_value(key),
                                                                     _descriptor(key))],
                                         group=[key for key in keys for _ in range(2)])
        return [found[2 * i] and found[2 * i + 1] for i in range(len(keys))]

    def get_into(self, key: str, out: BufferLike) -> bool:
        """Read the output of ``key`` into ``out`` (a contiguous tensor of its dtype and
        shape, host or GPU); False on a miss, including a stored output of another dtype or
        shape (``out`` may then hold anything)."""
        return self.get_into_many([key], [out])[0]

    def get_into_many(self, keys: Sequence[str], outs: Sequence[BufferLike]) -> list[bool]:
        if len(keys) != len(outs):
            raise InvalidRequest(f"get_into_many got {len(keys)} keys and {len(outs)} outs")
        descriptors = [bytearray(DESCRIPTOR_BYTES) for _ in keys]
        names = [k for key in keys for k in (_descriptor(key), _value(key))]
        targets = [t for pair in zip(descriptors, (as_bytes(o, writable=True) for o in outs),
                                     strict=True) for t in pair]
        try:
            got = self.client.batch_get_into(names, targets,
                                             group=[key for key in keys for _ in range(2)])
        except InvalidRequest:              # a stored value larger than its out: that one
            if len(keys) == 1:              # misses, the rest are asked one by one
                return [False]
            return [self.get_into(key, out) for key, out in zip(keys, outs, strict=True)]
        out = []
        for i, tensor in enumerate(outs):
            n_desc, n_value = got[2 * i], got[2 * i + 1]
            found = None if n_desc is None else \
                EncoderOutput.from_bytes(memoryview(descriptors[i])[:n_desc])
            out.append(found == EncoderOutput.of(tensor) and n_value == _size(tensor))
        return out

    def describe(self, key: str) -> EncoderOutput | None:
        """The dtype and shape of the output stored under ``key``; None on a miss."""
        raw = self.client.get(_descriptor(key), group=key)
        return None if raw is None else EncoderOutput.from_bytes(raw)

    def get(self, key: str, *, device: Any = "cpu") -> Any:
        """The output of ``key`` as a new tensor on ``device``; None on a miss."""
        return self.get_many([key], device=device)[0]

    def get_many(self, keys: Sequence[str], *, device: Any = "cpu") -> list[Any]:
        """``get`` of each of ``keys``: their descriptors in one batch, then the outputs found
        in another, each into a new tensor on ``device``; None for a miss."""
        import torch
        if not keys:
            return []
        raws = self.client.batch_get([_descriptor(k) for k in keys], group=list(keys))
        out: list[Any] = [None] * len(keys)
        for i, raw in enumerate(raws):
            found = None if raw is None else EncoderOutput.from_bytes(raw)
            dtype = None if found is None else getattr(torch, found.dtype, None)
            if found is not None and isinstance(dtype, torch.dtype):
                out[i] = torch.empty(found.shape, dtype=dtype, device=device)
        asked = [i for i, tensor in enumerate(out) if tensor is not None]
        got = self.get_into_many([keys[i] for i in asked],
                                 [out[i] for i in asked]) if asked else []
        for i, ok in zip(asked, got, strict=True):
            if not ok:
                out[i] = None
        return out


def _value(key: str) -> str:
    return f"{key}/v"


def _descriptor(key: str) -> str:
    return f"{key}/d"


def _size(value: BufferLike) -> int:
    """Bytes of a tensor (host or GPU) or of a host buffer."""
    return nbytes(as_bytes(value, writable=False))
