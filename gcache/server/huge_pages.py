"""Huge pages under the arena: asking for them, and telling whether it got them.

An arena on 4 KiB pages costs every remote reader once per page: NIXL over UCX's CMA
(``process_vm_readv``) pins the server's pages one by one, and a NIC maps a registered region
with one translation entry per page. Measured here (``bench/dataplane.py``): bare NIXL READs
of 4 MiB from a /dev/shm mapping ran at 4.2 GB/s, from the same mapping on a tmpfs mounted
``huge=always`` at 15.2 GB/s, as fast as anonymous memory on transparent huge pages. /dev/shm
gets huge pages only where the kernel's ``shmem_enabled`` says so, so the way to them is an
``arena_dir`` on a tmpfs mounted with ``huge=within_size`` (or ``advise``: the arena asks), or on
hugetlbfs; docs/rdma.md says how. Where the arena got none, ``small_pages_reason`` says why in
the server's one start-up line about pages (the mount and the kernel's switches decide, never a
flag of ours).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import subprocess
import tempfile
from collections.abc import Iterator

_SMAPS = "/proc/self/smaps"
_MOUNTS = "/proc/self/mounts"
_THP = "/sys/kernel/mm/transparent_hugepage"
_HUGE_FIELDS = ("AnonHugePages:", "ShmemPmdMapped:", "FilePmdMapped:")


def advise_huge_pages(mapping: mmap.mmap) -> bool:
    """Ask for huge pages under ``mapping`` (a tmpfs mounted ``huge=advise`` needs it); False
    where the kernel has no transparent huge pages for it."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None:
        return False
    try:
        mapping.madvise(advice)
    except OSError:
        return False
    return True


def huge_page_bytes(address: int, smaps: str = _SMAPS) -> tuple[int, int]:
    """(bytes on huge pages, bytes resident) of the mapping that starts at ``address`` in this
    process, from ``smaps``; (0, 0) when there is no such mapping or it cannot be read."""
    try:
        with open(smaps) as lines:
            text = lines.read()
    except OSError:
        return 0, 0
    found, fields = False, {}
    for line in text.splitlines():
        head = line.split(maxsplit=1)[0] if line else ""
        if "-" in head and not head.endswith(":"):
            if found:
                break                                      # past the mapping's own fields
            found = int(head.split("-")[0], 16) == address
        elif found:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0]] = int(parts[1]) * 1024
    if not found:
        return 0, 0
    resident = fields.get("Rss:", 0)
    if fields.get("KernelPageSize:", 4096) > 4096:            # hugetlbfs: every page is huge
        return resident, resident
    return min(resident, sum(fields.get(f, 0) for f in _HUGE_FIELDS)), resident


def _mount_of(path: str, mounts: str) -> tuple[str, str, set[str]] | None:
    """(mount point, file system type, options) of the mount that holds ``path``."""
    try:
        with open(mounts) as lines:
            table = [line.split() for line in lines]
    except OSError:
        return None
    path = os.path.realpath(path)
    best: tuple[str, str, set[str]] | None = None
    for fields in table:
        if len(fields) < 4:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fields[2], set(fields[3].split(",")))
    return best


def _selected(text: str) -> str:
    """The bracketed choice of a sysfs switch (``always [madvise] never`` -> ``madvise``)."""
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else text.strip()


def small_pages_reason(path: str, *, mounts: str = _MOUNTS, thp: str = _THP) -> str:
    """Why a file at ``path``, mapped and madvised, sits on 4 KiB pages, in words: what the
    mount (``huge=`` of a tmpfs, or not a tmpfs at all) or the kernel (no transparent huge
    pages, ``shmem_enabled`` deny) decided; or that huge pages were allowed and the kernel
    found none free (fragmented memory)."""
    try:
        with open(os.path.join(thp, "shmem_enabled")) as fh:
            shmem = _selected(fh.read())
    except OSError:
        return "this kernel has no transparent huge pages for shared memory"
    mount = _mount_of(path, mounts)
    if mount is None:
        return f"the mount holding {path} is not known ({mounts} unreadable)"
    point, fs_type, options = mount
    huge = next((o.split("=", 1)[1] for o in options if o.startswith("huge=")), "never")
    if fs_type == "hugetlbfs":
        return f"{point} is hugetlbfs but its pages are not huge (no huge pages reserved?)"
    if fs_type != "tmpfs":
        return f"{point} is {fs_type}, not a tmpfs"
    if shmem == "deny":
        return "the kernel's transparent_hugepage/shmem_enabled is deny"
    if shmem == "force" or huge in ("always", "within_size", "advise"):
        return (f"{point} allows huge pages (huge={huge}, shmem_enabled {shmem}) but the "
                "kernel had none free (fragmented memory)")
    return f"{point} is a tmpfs mounted with huge={huge}"


@contextlib.contextmanager
def huge_tmpfs(size_bytes: int) -> Iterator[str | None]:
    """A private tmpfs of ``size_bytes`` mounted ``huge=within_size`` for the duration, for an
    arena in a test or a benchmark run; None (nothing mounted) where this process may not
    mount one. Operators mount theirs once, from fstab or a mount unit (docs/rdma.md)."""
    if os.geteuid() != 0:
        yield None
        return
    where = tempfile.mkdtemp(prefix="gcache-huge-")
    options = f"size={size_bytes},huge=within_size,mode=0700"
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "gcache-huge", where],
                             capture_output=True).returncode == 0
    try:
        yield where if mounted else None
    finally:
        if mounted and subprocess.run(["umount", where], capture_output=True).returncode:
            # still mapped by someone (a process that has not exited yet): detach it now, the
            # kernel frees it with the last mapping
            subprocess.run(["umount", "--lazy", where], capture_output=True)
        os.rmdir(where)
