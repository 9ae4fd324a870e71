"""``gcache files push DIR --name NAME`` / ``pull NAME DEST`` / ``ls [PREFIX]`` / ``rm NAME`` /
``prune NAME``: directories (model weights) in GCache through ``gcache.files``.

A pushed directory is its files, each stored as ``NAME/<relative path>``, and an index stored as
``NAME`` itself (a JSON list of the relative paths and sizes, with metadata ``kind:
directory``), written last: a pull reads the index once, so it gets the files of one push.
Progress goes to stderr with the bytes moved and GB/s.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any

from gcache.cli.top import add_target_flags, targets_of
from gcache.errors import InvalidRequest


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    files = sub.add_parser("files",
                           help="directories (model weights) in GCache: push, pull, ls, rm, "
                           "prune")
    verbs = files.add_subparsers(dest="verb", required=True)
    push = verbs.add_parser("push", help="store every file under DIR as NAME/<path>")
    push.add_argument("dir")
    push.add_argument("--name", required=True)
    push.add_argument("--replicas", type=int, default=1,
                      help="copies of each chunk on distinct servers (default 1)")
    pull = verbs.add_parser("pull", help="write NAME's files under DEST")
    pull.add_argument("name")
    pull.add_argument("dest")
    ls = verbs.add_parser("ls", help="the files stored under PREFIX: size, chunks, copies")
    ls.add_argument("prefix", nargs="?", default="")
    rm = verbs.add_parser("rm", help="delete NAME's files, and the chunks no other file shares")
    rm.add_argument("name")
    prune = verbs.add_parser("prune", help="drop the earlier versions of NAME's files (each "
                             "push keeps the last one pinned for its readers until then) and "
                             "the files NAME's index no longer lists")
    prune.add_argument("name")
    for verb in (push, pull, ls, rm, prune):
        add_target_flags(verb)
        verb.add_argument("--chunk-size", type=int, default=None,
                          help="bytes per chunk (default: one fills a 16 MiB arena segment)")
        verb.add_argument("--quiet", action="store_true", help="no progress")
        verb.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from gcache.files import DEFAULT_CHUNK_SIZE, FileStore
    from gcache.files.directory import prune_directory, remove_directory
    from gcache.sdk import Client
    with Client(config=targets_of(args).config) as client:
        store = FileStore(client, chunk_size=args.chunk_size or DEFAULT_CHUNK_SIZE,
                          replicas=getattr(args, "replicas", 1))
        try:
            if args.verb == "push":
                return _push(store, pathlib.Path(args.dir), args.name, args.quiet)
            if args.verb == "pull":
                return _pull(store, args.name, pathlib.Path(args.dest), args.quiet)
            if args.verb == "ls":
                return _ls(store, args.prefix)
            if args.verb == "prune":
                dropped, stale = prune_directory(store, args.name)
                print(f"pruned {args.name}: {dropped} earlier versions dropped"
                      + (f"; removed {len(stale)} file(s) its index no longer lists"
                         if stale else ""))
                return 0
            print(f"removed {args.name} ({remove_directory(store, args.name)} files)")
            return 0
        except FileNotFoundError as exc:
            raise InvalidRequest(str(exc)) from None


def _push(store: Any, root: pathlib.Path, name: str, quiet: bool) -> int:
    from gcache.files.directory import push_directory
    progress = _Progress(sum(p.stat().st_size for p in root.rglob("*") if p.is_file()), quiet)
    entries = push_directory(store, root, name,
                             on_file=lambda entry: progress.add(entry.size, entry.path))
    progress.done(f"pushed {len(entries)} files as {name}")
    return 0


def _pull(store: Any, name: str, dest: pathlib.Path, quiet: bool) -> int:
    from gcache.files.directory import directory_file, directory_index
    index = directory_index(store, name)
    progress = _Progress(sum(e.size for e in index), quiet)
    for entry in index:
        target = dest / entry.path
        target.parent.mkdir(parents=True, exist_ok=True)
        manifest = store.get_file(directory_file(store, name, entry), target)
        progress.add(manifest.size, entry.path)
    progress.done(f"pulled {len(index)} files of {name} into {dest}")
    return 0


def _ls(store: Any, prefix: str) -> int:
    manifests = store.manifests(prefix)
    for m in manifests:
        kind = m.metadata.get("kind", "file")
        print(f"{m.size:>15}  {len(m.chunks):>6} chunks  x{m.replicas}  {kind:<9}  {m.name}")
    print(f"{len(manifests)} files, {sum(m.size for m in manifests)} bytes")
    return 0


class _Progress:
    def __init__(self, total: int, quiet: bool) -> None:
        self.total, self.quiet, self.moved = total, quiet, 0
        self.started = time.perf_counter()

    def add(self, n: int, what: str) -> None:
        self.moved += n
        if not self.quiet:
            seconds = max(time.perf_counter() - self.started, 1e-9)
            sys.stderr.write(f"\r{self.moved / 2**20:9.1f} / {self.total / 2**20:.1f} MiB "
                             f"{self.moved / seconds / 1e9:6.2f} GB/s  {what[-40:]:<40}")
            sys.stderr.flush()

    def done(self, message: str) -> None:
        seconds = max(time.perf_counter() - self.started, 1e-9)
        if not self.quiet:
            sys.stderr.write("\n")
        print(f"{message}: {self.moved} bytes in {seconds:.2f} s "
              f"({self.moved / seconds / 1e9:.2f} GB/s)")
        sys.stdout.flush()
