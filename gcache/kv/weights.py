"""A fingerprint of a model's weights, so that KV computed with other weights is never loaded.

Keys name a model by its path or hub name; new weights served under the same name would
otherwise load the old weights' KV and silently change the output. The fingerprint covers the
model directory's ``config.json`` and, for every ``*.safetensors`` file, its size, its header
(tensor names, dtypes, shapes, data offsets) and ``SAMPLE_BYTES`` at the start, the middle and
the end of every tensor's data (``sampled_spans``). The headers alone do not change when a model
of the same architecture is retrained or fine-tuned; a few bytes of every tensor do, and
reading them costs three small reads per tensor (a few MB for the largest models), not a read
of the weights. A change confined to bytes no sample touches is not seen.
"""

from __future__ import annotations

import json
import os
import struct

import xxhash

from gcache.errors import ConfigError

SAMPLE_BYTES = 64
MAX_HEADER_BYTES = 100 << 20      # safetensors' own limit on a header


def weights_fingerprint(model_dir: str | os.PathLike[str]) -> str | None:
    """A hex digest of the weights in ``model_dir``; None when it holds no safetensors file
    (the caller then keys by name alone, and says so). Raises ConfigError for a safetensors
    file whose header cannot be read."""
    folder = os.fspath(model_dir)
    files = sorted(name for name in os.listdir(folder) if name.endswith(".safetensors"))
    if not files:
        return None
    digest = xxhash.xxh3_128()
    config = os.path.join(folder, "config.json")
    if os.path.isfile(config):
        with open(config, "rb") as fh:
            raw = fh.read()
        digest.update(struct.pack("<Q", len(raw)) + raw)
    for name in files:
        digest.update(name.encode() + b"\0")
        _add_file(digest, os.path.join(folder, name))
    return digest.hexdigest()


def _add_file(digest: xxhash.xxh3_128, path: str) -> None:
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        raw = fh.read(8)
        header_len = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
        if not 0 < header_len <= min(MAX_HEADER_BYTES, size - 8):
            raise ConfigError("model weights", path, f"not a safetensors file (header length "
                              f"{header_len} in a {size}-byte file)")
        header = fh.read(header_len)
        try:
            tensors = json.loads(header)
            spans = sorted((int(t["data_offsets"][0]), int(t["data_offsets"][1]))
                           for key, t in tensors.items() if key != "__metadata__")
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            raise ConfigError("model weights", path,
                              f"unreadable safetensors header: {exc}") from None
        if spans and 8 + header_len + spans[-1][1] > size:
            raise ConfigError("model weights", path, f"truncated: its header places data up to "
                              f"byte {8 + header_len + spans[-1][1]} of a {size}-byte file")
        digest.update(struct.pack("<QQ", size, header_len))
        digest.update(header)
        for start, stop in spans:
            for offset, n in sampled_spans(start, stop):
                fh.seek(8 + header_len + offset)
                digest.update(fh.read(n))


def sampled_spans(start: int, stop: int) -> list[tuple[int, int]]:
    """(offset, length) of the bytes of a tensor's data ``[start, stop)`` that are sampled."""
    n = min(SAMPLE_BYTES, max(0, stop - start))
    middle = start + (stop - start) // 2
    return [(start, n), (min(middle, stop - n), n), (stop - n, n)]
