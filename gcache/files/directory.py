"""A directory in GCache (a model's weights): each file stored as ``NAME/<relative path>``, and
an index stored as ``NAME`` itself, written last: a JSON list of the files' relative paths,
sizes and content digests, with metadata ``kind: directory``. A reader reads the index once and
checks each file's version against it, so it gets the files of one push or an error.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

import xxhash

from gcache.errors import InvalidRequest
from gcache.files.manifest import Manifest
from gcache.files.store import FileStore


@dataclass(frozen=True)
class DirectoryEntry:
    path: str                 # relative, with forward slashes
    size: int
    digest: str               # the file's content digest when the directory was pushed


class DirectoryChanged(InvalidRequest):
    """A file of the directory was pushed again since its index was read."""


def push_directory(store: FileStore, root: pathlib.Path, name: str, *,
                   on_file: Callable[[DirectoryEntry], None] | None = None
                   ) -> list[DirectoryEntry]:
    """Store every file under ``root`` as ``name/<path>``, then the index as ``name``."""
    if not root.is_dir():
        raise InvalidRequest(f"{root} is not a directory")
    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        manifest = store.put_file(f"{name}/{relative}", path)
        entries.append(DirectoryEntry(relative, manifest.size, manifest.digest))
        if on_file is not None:
            on_file(entries[-1])
    index = [{"path": e.path, "size": e.size, "digest": e.digest} for e in entries]
    store.put_file(name, json.dumps(index).encode(), metadata={"kind": "directory"})
    return entries


def directory_index(store: FileStore, name: str) -> list[DirectoryEntry]:
    """The files of the directory pushed as ``name``; ``FileNotFoundError`` when there is none."""
    manifest = store.stat(name)
    if manifest is None or manifest.metadata.get("kind") != "directory":
        raise FileNotFoundError(f"no directory {name!r} pushed to GCache")
    raw = bytearray(manifest.size)
    store.get_file(manifest.name, raw)
    try:
        return [DirectoryEntry(str(e["path"]), int(e["size"]), str(e["digest"]))
                for e in json.loads(bytes(raw))]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"the index of directory {name!r} is not one: {exc}") from exc


def directory_file(store: FileStore, name: str, entry: DirectoryEntry) -> Manifest:
    """The manifest of ``entry`` of directory ``name``, of the version its index names:
    ``FileNotFoundError`` when it is gone, ``DirectoryChanged`` when it was pushed again."""
    manifest = store.stat(f"{name}/{entry.path}")
    if manifest is None:
        raise FileNotFoundError(f"{name}/{entry.path} is not in GCache")
    if manifest.digest != entry.digest:
        raise DirectoryChanged(f"{name}/{entry.path} was pushed again since its directory's "
                               "index was read; read it again")
    return manifest


def prune_directory(store: FileStore, name: str) -> tuple[int, list[str]]:
    """``FileStore.prune(name)``, and for a directory first every file under ``name/`` that
    its index no longer lists (a file an earlier push had), except a directory pushed on its
    own under ``name/`` and its files. (The earlier versions dropped, the files removed.)
    Not while ``name`` is pushed: the new files of a push in progress are not listed yet."""
    try:
        listed = {f"{name}/{entry.path}" for entry in directory_index(store, name)}
    except FileNotFoundError:
        listed = None
    stale: list[str] = []
    if listed is not None:
        unlisted = [m for m in store.manifests(f"{name}/") if m.name not in listed]
        nested = tuple(m.name + "/" for m in unlisted if m.metadata.get("kind") == "directory")
        stale = [m.name for m in unlisted
                 if m.metadata.get("kind") != "directory" and not m.name.startswith(nested)]
        store.delete_many(stale)
    return store.prune(name), stale


def content_digest(entries: list[DirectoryEntry], *, suffix: str = "") -> str:
    """One digest of the paths and content digests of ``entries`` ending in ``suffix``: equal
    exactly when those files' bytes are (a model's weights, whatever its README says)."""
    digest = xxhash.xxh3_128()
    for entry in sorted(entries, key=lambda e: e.path):
        if entry.path.endswith(suffix):
            digest.update(f"{entry.path}\0{entry.size}\0{entry.digest}\n".encode())
    return digest.hexdigest()


def remove_directory(store: FileStore, name: str) -> int:
    """Delete ``name``'s files and index (``FileStore.delete_many``: their chunks too, unless
    another file names them), with every file under ``name/`` that its index no longer lists
    (an earlier push had it); the files removed."""
    entries = directory_index(store, name)
    files = {f"{name}/{entry.path}" for entry in entries} | set(store.list(f"{name}/"))
    store.delete_many(sorted(files) + [name])
    return len(files)
