"""An upgrade keeps the hot tier: today's gcache-server started on an arena written by an earlier
release serves what that release stored (arena images under ``arena_images/``, written by the
releases themselves; real server processes). Format 3 records are read as they are, format 2
spans migrated in place; either way every value is checked against its checksum, and a second
restart reads the arena as today's format."""

from __future__ import annotations

import gzip
import json
import os
import pathlib
import shutil
import subprocess
import sys
import uuid

import pytest
import xxhash

from gcache.cli.ports import free_port
from gcache.sdk import Client

IMAGES = pathlib.Path(__file__).resolve().parent / "arena_images"


class ImageServer:
    """A gcache-server on a copy of an image, in a folder of /dev/shm of its own."""

    def __init__(self, image: str, log: pathlib.Path) -> None:
        self.manifest = json.loads((IMAGES / image / "manifest.json").read_text())
        self.folder = f"/dev/shm/gcache-upgrade-{uuid.uuid4().hex[:8]}"
        os.mkdir(self.folder, 0o700)
        with gzip.open(IMAGES / image / "gcache-image.gz") as src, \
                open(os.path.join(self.folder, "gcache-image"), "wb") as dst:
            shutil.copyfileobj(src, dst)
        if (IMAGES / image / "gcache-image.key").exists():
            shutil.copy(IMAGES / image / "gcache-image.key", self.folder)
            os.chmod(os.path.join(self.folder, "gcache-image.key"), 0o600)
        self.log, self.address, self.proc = log, f"127.0.0.1:{free_port()}", None

    def start(self) -> str:
        """Start it; returns what it logged up to ready."""
        seg, memory = self.manifest["segment_size"], self.manifest["memory"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gcache.server.main", "--listen", self.address,
             "--memory", str(memory), "--segment-size", str(seg), "--arena-dir", self.folder,
             "--shm-name", "gcache-image", "--unix-socket", "off", "--no-nixl"],
            stderr=subprocess.PIPE, text=True)
        lines = []
        for line in self.proc.stderr:
            lines.append(line)
            if "gcache-server ready" in line:
                return "".join(lines)
        raise AssertionError("server did not start:\n" + "".join(lines))

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(20)
            self.proc.stderr.close()
            self.proc = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def image_server(tmp_path):
    made: list[ImageServer] = []

    def make(image: str) -> ImageServer:
        made.append(ImageServer(image, tmp_path / f"{image}.log"))
        return made[-1]
    yield make
    for server in made:
        server.remove()


def served(server: ImageServer) -> tuple[dict[str, str | None], list[bytes]]:
    """What the server answers for every key of the manifest (xxh3:length or None), and its
    pinned keys."""
    keys = [*server.manifest["present"], *server.manifest["absent"]]
    with Client([server.address], timeout_s=5.0, transport="tcp") as client:
        values = {k: client.get(k) for k in keys}
        pinned = client.list_pinned("img/")
    return ({k: None if v is None else f"{xxhash.xxh3_64_hexdigest(v)}:{len(v)}"
             for k, v in values.items()}, pinned)


@pytest.mark.parametrize("image", ["format3", "format2"])
def test_a_new_release_serves_the_arena_an_earlier_one_left(image_server, image):
    server = image_server(image)
    log = server.start()
    expected = {**server.manifest["present"], **dict.fromkeys(server.manifest["absent"])}
    pinned = sorted(k.encode() for k in server.manifest.get("pinned", []))
    try:
        assert served(server) == (expected, pinned), log
        assert f"objects={len(server.manifest['present'])} " in log, log
        assert "migrated=0" not in log, log              # format 3 restamped, 2 rewritten
        server.stop()
        log = server.start()                             # today's format from here on
        assert served(server) == (expected, pinned), log
        assert "migrated=0" in log and "corrupt=0 bad_headers=0" in log, log
    finally:
        server.stop()
