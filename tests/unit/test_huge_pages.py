"""Huge pages under the arena: ``--arena-dir``, asking for them, and reading back the share."""

import os
import textwrap
import uuid

import pytest

from gcache.config import ServerConfig
from gcache.errors import ConfigError
from gcache.server.arena import Arena
from gcache.server.huge_pages import huge_page_bytes, huge_tmpfs

MiB = 1 << 20
SMAPS = textwrap.dedent("""\
    7f0000000000-7f0000400000 rw-s 00000000 00:1a 42    /dev/shm/gcache-a
    Size:               4096 kB
    KernelPageSize:        4 kB
    Rss:                4096 kB
    ShmemPmdMapped:        0 kB
    7f1000000000-7f1000800000 rw-s 00000000 00:2b 43    /mnt/huge/gcache-b (deleted)
    Size:               8192 kB
    KernelPageSize:        4 kB
    Rss:                8192 kB
    ShmemPmdMapped:     6144 kB
    FilePmdMapped:         0 kB
    7f2000000000-7f2000400000 rw-s 00000000 00:2c 44    /dev/hugepages/gcache-c
    Size:               4096 kB
    KernelPageSize:     2048 kB
    Rss:                4096 kB
    Shared_Hugetlb:     4096 kB
    """)


def arena(directory: str, *, size: int = 32 * MiB) -> Arena:
    return Arena(name=f"gcache-unit-{uuid.uuid4().hex[:8]}", size_bytes=size,
                 segment_size=4 * MiB, prefault=True,
                 directory=directory)


def test_the_share_of_a_mapping_on_huge_pages_is_read_from_smaps(tmp_path):
    smaps = tmp_path / "smaps"
    smaps.write_text(SMAPS)
    assert huge_page_bytes(0x7f0000000000, str(smaps)) == (0, 4 * MiB)
    assert huge_page_bytes(0x7f1000000000, str(smaps)) == (6 * MiB, 8 * MiB)
    assert huge_page_bytes(0x7f2000000000, str(smaps)) == (4 * MiB, 4 * MiB)  # hugetlbfs
    assert huge_page_bytes(0x7f3000000000, str(smaps)) == (0, 0)              # no such mapping
    assert huge_page_bytes(0x7f0000000000, str(tmp_path / "absent")) == (0, 0)


def test_an_arena_lives_in_its_arena_dir_and_reads_its_own_mapping():
    where = f"/dev/shm/gcache-unit-dir-{uuid.uuid4().hex[:8]}"
    os.mkdir(where, 0o700)
    try:
        made = arena(where)
        try:
            assert os.path.dirname(made.path) == where and os.path.exists(made.path + ".key")
            huge, resident = huge_page_bytes(made.address)
            assert resident == made.size_bytes and 0 <= huge <= resident   # prefaulted
        finally:
            made.close(unlink=True)
        assert os.listdir(where) == []
    finally:
        os.rmdir(where)


def test_a_missing_or_relative_arena_dir_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="arena_dir.*not a directory"):
        arena(str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="arena_dir.*absolute"):
        ServerConfig(arena_dir="shm")


def test_an_arena_on_a_huge_page_tmpfs_is_on_huge_pages():
    with huge_tmpfs(64 * MiB) as where:
        if where is None:
            pytest.skip("this process may not mount a tmpfs (needs root and CAP_SYS_ADMIN)")
        made = arena(where)
        try:
            huge, resident = huge_page_bytes(made.address)
            assert resident == made.size_bytes and huge == resident, (huge, resident)
        finally:
            made.close(unlink=True)
