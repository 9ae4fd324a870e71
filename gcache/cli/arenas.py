"""``gcache arenas``: the hot-tier arenas on this host, and removing those no server uses.

An arena outlives its server by design (a restarted server re-attaches to its memory), so a
server stopped for good leaves its memory in ``/dev/shm`` until someone removes the file. An
arena is a file beside which the server keeps its header key (``<name>.key``); a running server
holds a POSIX lock on it (``gcache.server.arena``), which tells live from stopped without
touching the arena's bytes: ``F_GETLK`` names the holder's PID. Removal takes that lock itself
first, so no server can start on the arena while its files go, and never removes one whose lock
is held. Files it removes: the arena and its sidecars (``.key``, and ``.id`` / ``.mutable`` /
``.mutable.epoch`` when the server kept them in ``/dev/shm``).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import struct
import time
from dataclasses import asdict, dataclass

from gcache.errors import InvalidRequest

SHM_DIR = "/dev/shm"
SIDECARS = (".key", ".id", ".mutable", ".mutable.epoch")
# struct flock: l_type, l_whence, l_start, l_len, l_pid (native layout, 32 bytes on Linux)
_FLOCK = struct.Struct("@hhqqi4x")


@dataclass(frozen=True, slots=True)
class ArenaInfo:
    name: str
    size_bytes: int
    state: str              # "live" (a server holds it), "stopped", or "unknown" (unreadable)
    pid: int                # the live server's PID, else 0
    age_s: float            # since the file last changed


def list_arenas(shm_dir: str = SHM_DIR) -> list[ArenaInfo]:
    """Every arena in ``shm_dir``, by name."""
    found = []
    for entry in sorted(os.listdir(shm_dir)):
        path = os.path.join(shm_dir, entry)
        if entry.endswith(SIDECARS) or not os.path.isfile(path + ".key") or \
                os.path.islink(path) or not os.path.isfile(path):
            continue
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            continue                                   # removed while we listed
        state, pid = _owner(path)
        found.append(ArenaInfo(entry, stat.st_size, state, pid,
                               max(0.0, time.time() - stat.st_mtime)))
    return found


def _owner(path: str) -> tuple[str, int]:
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        return "unknown", 0
    try:
        probe = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        kind, _, _, _, pid = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, probe))
    except OSError:
        return "unknown", 0
    finally:
        os.close(fd)
    return ("stopped", 0) if kind == fcntl.F_UNLCK else ("live", pid)


def remove_stopped(names: list[str], shm_dir: str = SHM_DIR) -> list[str]:
    """Remove the named arenas that no server holds (with their sidecars); the names removed.
    A live or unreadable one is left as it is."""
    removed = []
    for name in names:
        path = os.path.join(shm_dir, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)    # held while the files go
        except OSError:
            os.close(fd)
            continue
        try:
            for victim in [path] + [path + suffix for suffix in SIDECARS]:
                try:
                    os.unlink(victim)
                except FileNotFoundError:
                    pass
            removed.append(name)
        finally:
            os.close(fd)
    return removed


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _run(args: argparse.Namespace) -> int:
    arenas = list_arenas(args.dir)
    if args.names:
        unknown = sorted(set(args.names) - {a.name for a in arenas})
        if unknown:
            raise InvalidRequest(f"no arena named {', '.join(unknown)} in {args.dir}")
        arenas = [a for a in arenas if a.name in args.names]
    removed: list[str] = []
    if args.remove_stopped:
        removed = remove_stopped([a.name for a in arenas if a.state == "stopped"], args.dir)
    if args.json:
        print(json.dumps({"arenas": [asdict(a) for a in arenas], "removed": removed}))
        return 0
    if not arenas:
        print(f"no arenas in {args.dir}")
        return 0
    print(f"{'NAME':<32}{'SIZE':>12}  {'STATE':<8}{'PID':>8}{'AGE':>10}")
    for a in arenas:
        state = "removed" if a.name in removed else a.state
        print(f"{a.name:<32}{_size(a.size_bytes):>12}  {state:<8}{a.pid or '-':>8}"
              f"{a.age_s / 3600:>9.1f}h")
    stopped = [a for a in arenas if a.state == "stopped" and a.name not in removed]
    if stopped and not args.remove_stopped:
        total = sum(a.size_bytes for a in stopped)
        print(f"{len(stopped)} stopped, {_size(total)}: gcache arenas --remove-stopped frees them")
    return 0


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = sub.add_parser("arenas", help="list this host's arenas (live, stopped) and remove "
                         "stopped ones on request")
    cmd.add_argument("names", nargs="*", help="only these arenas (default: every one)")
    cmd.add_argument("--dir", default=SHM_DIR, help="where arenas live (default /dev/shm)")
    cmd.add_argument("--remove-stopped", action="store_true",
                     help="remove arenas no server holds, with their sidecar files")
    cmd.add_argument("--json", action="store_true", help="print JSON")
    cmd.set_defaults(run=_run)
