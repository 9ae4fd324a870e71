"""The C example of docs/sdk-c.md, exactly as printed: extracted from the page, compiled against
libgcache.a and run against a real gcache-server on the address it names (127.0.0.1:7730)."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import uuid

from c_programs import BUILD, SDK

from gcache.cli.arenas import SHM_DIR, SIDECARS

README = SDK.parent / "docs" / "sdk-c.md"
ADDRESS = "127.0.0.1:7730"
READY = "gcache-server ready listen="


def readme_block(name: str) -> str:
    """The body of the fenced block right after ``<!-- tested: name -->``."""
    match = re.search(r"<!-- tested: " + re.escape(name) + r" -->\s*```[a-z]*\n(.*?)```",
                      README.read_text(), re.S)
    assert match is not None, f"{README} has no block marked 'tested: {name}'"
    return match.group(1)


def start_server(shm_name: str, log: pathlib.Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gcache.server.main", "--listen", ADDRESS,
                                 "--memory", "64MiB", "--shm-name", shm_name],
                                stdout=out, stderr=out, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while READY not in log.read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.05)
    return proc


def test_the_c_example_runs_as_printed(tmp_path):
    source = tmp_path / "example.c"
    source.write_text(readme_block("c-sdk"))
    program = tmp_path / "example"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", f"-I{SDK / 'include'}", str(source),
                    str(BUILD / "libgcache.a"), "-lxxhash", "-lpthread", "-lm", "-o",
                    str(program)], check=True, timeout=120)
    shm_name = f"gcache-readme-c-{uuid.uuid4().hex[:8]}"
    server = start_server(shm_name, tmp_path / "server.log")
    try:
        done = subprocess.run([str(program)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout == "put: ok, get: 4096 bytes\n"
    finally:
        os.kill(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, signal.SIGKILL)
            server.wait(10)
        arena = os.path.join(SHM_DIR, shm_name)
        for leftover in (arena, *(arena + s for s in SIDECARS), f"/tmp/{shm_name}.sock"):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass
