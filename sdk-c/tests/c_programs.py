"""How the pytest files of sdk-c run libgcache's sanitizer-built test programs, and the values
both languages put (testing.h's value_of and size_of, in Python)."""

from __future__ import annotations

import os
import pathlib
import subprocess

import numpy as np

from gcache.keys import key_hash

SDK = pathlib.Path(__file__).resolve().parents[1]
BUILD = SDK / "build"
VECTORS = SDK.parent / "tests" / "vectors"
SIZES = (1, 100, 4095, 4096, 65537, 1 << 20, (1 << 20) + 3, 3 << 20)   # testing.h's size_of
TRANSPORTS = ("tcp", "shm")


def value_of(key: str, size: int) -> bytes:
    """The bytes testing.h's value_of makes for ``key``: (seed + 7 j + (j >> 8)) & 0xFF."""
    j = np.arange(size, dtype=np.uint64)
    seed = key_hash(key.encode()) & 0xFF
    return ((seed + 7 * j + (j >> 8)) & 0xFF).astype(np.uint8).tobytes()


def run(program: str, *args: str, timeout_s: float = 120) -> str:
    """Run a sanitizer-built test program; its stdout. Fails on a non-zero exit (a failed
    CHECK, or ASan/UBSan, which exit non-zero), showing both streams."""
    path = BUILD / program
    assert path.exists(), f"{path} is missing: build it with make -C sdk-c test"
    done = subprocess.run([str(path), *args], capture_output=True, text=True, timeout=timeout_s,
                          env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"))
    assert done.returncode == 0, f"{program} {' '.join(args)} exited {done.returncode}\n" \
                                 f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-6000:]}"
    return done.stdout


