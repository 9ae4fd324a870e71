"""The buffers reads returning bytes land in: reused, bounded, never handed out twice."""

from gcache.sdk.receive_buffers import LARGEST, SMALLEST, ReceiveBuffers


def test_a_buffer_given_back_is_lent_again_for_a_value_of_its_size_class():
    pool = ReceiveBuffers()
    first = pool.take(3 << 20)
    assert len(first) == 3 << 20 and len(first.obj) == 4 << 20
    buffer = first.obj
    pool.give(first)
    assert pool.kept_bytes() == 4 << 20
    again = pool.take((3 << 20) + 5)
    assert again.obj is buffer and len(again) == (3 << 20) + 5 and pool.kept_bytes() == 0
    other = pool.take(3 << 20)                  # lent already: another one
    assert other.obj is not buffer


def test_small_large_and_foreign_buffers_are_not_kept():
    pool = ReceiveBuffers()
    for view in (pool.take(SMALLEST - 1), pool.take(LARGEST + 1),
                 memoryview(bytearray(1 << 20)[:100]), memoryview(b"x" * SMALLEST),
                 memoryview(bytearray(3 << 20))):
        pool.give(view)
    assert pool.kept_bytes() == 0


def test_what_is_kept_idle_is_bounded():
    pool = ReceiveBuffers(kept_bytes=8 << 20)
    lent = [pool.take(4 << 20) for _ in range(3)]
    for view in lent:
        pool.give(view)
    assert pool.kept_bytes() == 8 << 20
