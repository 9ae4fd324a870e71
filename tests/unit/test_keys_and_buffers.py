import numpy as np
import pytest

from gcache.buffer import as_memoryview
from gcache.keys import checksum, checksum_stream, validate_key


@pytest.mark.parametrize("key,expected", [
    ("abc", b"abc"), (b"abc", b"abc"), (bytearray(b"k"), b"k"), ("é", "é".encode()),
    ("x" * 1024, b"x" * 1024),
])
def test_valid_keys(key, expected):
    assert validate_key(key) == expected


@pytest.mark.parametrize("key,error,message", [
    ("", ValueError, "empty"), (b"", ValueError, "empty"),
    ("x" * 1025, ValueError, "1025 bytes; limit is 1024"), (7, TypeError, "int"),
    (None, TypeError, "NoneType"),
])
def test_invalid_keys_name_the_rule(key, error, message):
    with pytest.raises(error, match=message):
        validate_key(key)


def test_streamed_checksum_equals_one_shot():
    data = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    hasher = checksum_stream()
    for start in range(0, len(data), 65537):
        hasher.update(data[start:start + 65537])
    assert hasher.intdigest() == checksum(data)


def test_buffer_protocol_objects_become_flat_byte_views():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    for obj, size in ((b"abc", 3), (bytearray(5), 5), (memoryview(b"xy"), 2), (array, 48)):
        view = as_memoryview(obj, writable=False)
        assert view.format == "B" and view.ndim == 1 and len(view) == size


def test_non_contiguous_and_read_only_buffers_are_refused():
    array = np.arange(16, dtype=np.uint8).reshape(4, 4)
    with pytest.raises(ValueError, match="non-contiguous"):
        as_memoryview(array[:, ::2], writable=False, what="value")
    with pytest.raises(TypeError, match="out is read-only"):
        as_memoryview(b"abc", writable=True, what="out")
    with pytest.raises(TypeError, match="not a buffer"):
        as_memoryview(12, writable=False)
    with pytest.raises(TypeError, match="is a str"):
        as_memoryview("text", writable=False)


def test_cpu_tensors_are_viewed_without_a_copy_for_any_dtype():
    torch = pytest.importorskip("torch")
    tensor = torch.arange(8, dtype=torch.bfloat16)
    view = as_memoryview(tensor, writable=True, what="out")
    assert len(view) == 16
    view[0:2] = b"\x00\x00"                    # writes land in the tensor itself
    assert tensor[0].item() == 0.0
    with pytest.raises(ValueError, match="non-contiguous tensor"):
        as_memoryview(torch.zeros(4, 4).t(), writable=False)
