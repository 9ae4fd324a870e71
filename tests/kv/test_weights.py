"""The weights' fingerprint that keys carry: it changes with the weights (also when only their
values change), not with where they are, and refuses a file that is no safetensors."""

import json
import shutil
import struct

import numpy as np
import pytest

from gcache.errors import ConfigError
from gcache.kv import weights_fingerprint


def write_model(folder, seed: int, *, shape=(8, 16), files=2):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"hidden_size": shape[1]}))
    rng = np.random.default_rng(seed)
    for f in range(files):
        tensors = {f"layer{f}.{name}": rng.standard_normal(shape).astype(np.float32)
                   for name in ("q", "k")}
        header, offset = {}, 0
        for name, array in tensors.items():
            header[name] = {"dtype": "F32", "shape": list(shape),
                            "data_offsets": [offset, offset + array.nbytes]}
            offset += array.nbytes
        raw = json.dumps(header).encode()
        with open(folder / f"model-{f}.safetensors", "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)) + raw)
            for array in tensors.values():
                fh.write(array.tobytes())
    return folder


def test_same_weights_anywhere_agree_and_new_values_disagree(tmp_path):
    a = weights_fingerprint(write_model(tmp_path / "a", seed=1))
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "a", copy)
    assert weights_fingerprint(copy) == a
    retrained = weights_fingerprint(write_model(tmp_path / "b", seed=2))   # same headers
    assert retrained != a
    assert weights_fingerprint(write_model(tmp_path / "c", seed=1, shape=(8, 8))) != a
    (copy / "config.json").write_text(json.dumps({"hidden_size": 17}))
    assert weights_fingerprint(copy) != a


def test_a_folder_without_safetensors_has_none_and_a_bad_file_is_named(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert weights_fingerprint(tmp_path) is None
    bad = tmp_path / "model.safetensors"
    bad.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(ConfigError, match="model.safetensors.*not a safetensors file"):
        weights_fingerprint(tmp_path)
    bad.write_bytes(struct.pack("<Q", 5) + b"[1, 2")
    with pytest.raises(ConfigError, match="unreadable safetensors header"):
        weights_fingerprint(tmp_path)
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 8)   # a partial download
    with pytest.raises(ConfigError, match="truncated"):
        weights_fingerprint(tmp_path)


def test_a_change_in_the_middle_or_at_the_end_of_a_tensor_is_seen(tmp_path):
    model = write_model(tmp_path / "m", seed=3, files=1)
    before = weights_fingerprint(model)
    path = next(model.glob("*.safetensors"))
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x40                                  # the last byte of the last tensor
    path.write_bytes(bytes(raw))
    assert weights_fingerprint(model) not in (before, None)
