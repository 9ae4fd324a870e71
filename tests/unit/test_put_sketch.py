"""The put sketch (``gcache.put_sketch``): counts that never undercount, age by halving as the
cache turns over, and are spent one pass at a time."""

from gcache.keys import key_hash
from gcache.put_sketch import REPUT_WINDOW, PutSketch


def hashes(n: int, prefix: str = "k") -> list[int]:
    return [key_hash(f"{prefix}{i}".encode()) for i in range(n)]


def test_counts_are_never_below_the_puts_and_rarely_above():
    sketch = PutSketch(1000)
    keys = hashes(3000)
    for i, h in enumerate(keys):
        for _ in range(1 + i % 3):
            sketch.add(h, held_objects=10**9)        # a window too long to close
    assert all(sketch.puts(h) >= 1 + i % 3 for i, h in enumerate(keys))
    assert sum(sketch.puts(h) != 1 + i % 3 for i, h in enumerate(keys)) <= 3
    assert all(sketch.puts(h) == 0 for h in hashes(1000, "never"))


def test_counts_halve_after_a_window_of_cache_fulls_of_puts():
    sketch = PutSketch(100)
    hot = key_hash(b"hot")
    for _ in range(8):
        sketch.add(hot, held_objects=100)
    assert sketch.puts(hot) == 8
    for h in hashes(REPUT_WINDOW * 100 - 8):            # the window closes on the last one
        sketch.add(h, held_objects=100)
    assert sketch.puts(hot) == 4


def test_a_pass_spends_one_put_and_counts_stop_at_zero_and_255():
    sketch = PutSketch(10)
    h = key_hash(b"k")
    for _ in range(300):
        sketch.add(h, held_objects=10**9)
    assert sketch.puts(h) == 255
    sketch.spend(h)
    assert sketch.puts(h) == 254
    other = key_hash(b"other")
    sketch.spend(other)
    assert sketch.puts(other) == 0


def test_a_large_cache_gets_wider_rows_up_to_the_cap():
    assert PutSketch(10)._bits == 16 and PutSketch(1 << 20)._bits == 22
    assert PutSketch(1 << 30)._bits == 22
