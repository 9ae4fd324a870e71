"""Why an arena sits on 4 KiB pages: the server's start-up line names the mount or the kernel
switch that decided (``huge_pages.small_pages_reason``), read from a mount table and a sysfs
directory written here."""

import os

import pytest

from gcache.server.huge_pages import small_pages_reason

MOUNTS = """\
overlay / overlay rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
tmpfs /mnt/huge tmpfs rw,relatime,size=2097152k,huge=within_size 0 0
tmpfs /mnt/never tmpfs rw,relatime,huge=never 0 0
hugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0
tmpfs /mnt/my\\040dir tmpfs rw,huge=advise 0 0
"""


def kernel(tmp_path, shmem: str) -> str:
    thp = tmp_path / "thp"
    thp.mkdir(exist_ok=True)
    (thp / "shmem_enabled").write_text(shmem + "\n")
    return str(thp)


@pytest.mark.parametrize(("path", "shmem", "reason"), [
    ("/dev/shm/gcache-1", "always within_size advise [never] deny force",
     "/dev/shm is a tmpfs mounted with huge=never"),
    ("/mnt/never/a", "always within_size advise [never] deny force",
     "/mnt/never is a tmpfs mounted with huge=never"),
    ("/var/lib/gcache/a", "always within_size advise [never] deny force",
     "/ is overlay, not a tmpfs"),
    ("/mnt/huge/a", "always within_size advise never [deny] force",
     "the kernel's transparent_hugepage/shmem_enabled is deny"),
    ("/mnt/huge/a", "always within_size advise [never] deny force",
     "/mnt/huge allows huge pages (huge=within_size, shmem_enabled never) but the kernel had "
     "none free (fragmented memory)"),
    ("/dev/shm/a", "always within_size advise never deny [force]",
     "/dev/shm allows huge pages (huge=never, shmem_enabled force) but the kernel had none "
     "free (fragmented memory)"),
    ("/mnt/my dir/a", "[never]", "/mnt/my dir allows huge pages (huge=advise, shmem_enabled "
     "never) but the kernel had none free (fragmented memory)"),
    ("/dev/hugepages/a", "[never]",
     "/dev/hugepages is hugetlbfs but its pages are not huge (no huge pages reserved?)"),
])
def test_the_reason_names_the_mount_or_kernel_switch_that_decided(tmp_path, path, shmem,
                                                                  reason):
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS)
    assert small_pages_reason(path, mounts=str(mounts), thp=kernel(tmp_path, shmem)) == reason


def test_a_kernel_without_shared_memory_huge_pages_says_so(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS)
    assert small_pages_reason("/dev/shm/a", mounts=str(mounts), thp=str(tmp_path / "none")) \
        == "this kernel has no transparent huge pages for shared memory"


def test_an_unreadable_mount_table_is_said_not_guessed(tmp_path):
    missing = os.path.join(tmp_path, "no-mounts")
    assert small_pages_reason("/dev/shm/a", mounts=missing,
                              thp=kernel(tmp_path, "[never]")) == \
        f"the mount holding /dev/shm/a is not known ({missing} unreadable)"


def test_this_hosts_arena_directory_gets_a_reason_in_words():
    assert small_pages_reason("/dev/shm")       # whatever this host is, a sentence
