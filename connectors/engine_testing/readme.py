"""The connectors' READMEs, run as printed: a shell block that follows the marker
``<!-- tested: NAME -->`` is what a test runs, through ``bash``, in a session of its own (so the
test stops exactly the processes the block started). A README that drifts from a working
command fails the build."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from engine_testing.shm import GroupFiles, names


def readme_block(readme: pathlib.Path, name: str) -> str:
    """The body of the fenced block right after ``<!-- tested: name -->``."""
    text = readme.read_text()
    match = re.search(r"<!-- tested: " + re.escape(name) + r" -->\s*```[a-z]*\n(.*?)```",
                      text, re.S)
    if match is None:
        raise AssertionError(f"{readme} has no block marked 'tested: {name}'")
    return match.group(1)


class Shell:
    """One README block running under ``bash -c``; its output goes to ``log_path``."""

    def __init__(self, script: str, log_path: pathlib.Path, *, env: dict[str, str]) -> None:
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(["bash", "-c", script], stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=dict(os.environ, **env), start_new_session=True)

    def log(self, tail: int = 40) -> str:
        lines = self.log_path.read_bytes().decode(errors="replace").splitlines()
        return "\n".join(line[:400] for line in lines[-tail:])

    def wait_for(self, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.log_path.read_bytes().decode(errors="replace"):
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"the README block exited with {self.proc.returncode}:\n"
                                   f"{self.log()}")
            time.sleep(0.2)
        raise TimeoutError(f"no {text!r} after {timeout_s}s:\n{self.log()}")

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the block's process group, then SIGKILL what is left of it."""
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait_s)
                if sig == signal.SIGTERM:
                    time.sleep(0.5)                # children of the group finish their exit
            except subprocess.TimeoutExpired:
                continue
        self._log.close()


def activated() -> dict[str, str]:
    """The environment as if this virtual environment were activated (the READMEs assume it)."""
    return {"PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def wait_healthy(url: str, shell: Shell, timeout_s: float = 300.0) -> None:
    """Until ``url``/health answers 200; raises if the block exits or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if shell.proc.poll() is not None:
            raise RuntimeError(f"the engine exited with {shell.proc.returncode}:\n{shell.log()}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise TimeoutError(f"not healthy after {timeout_s}s:\n{shell.log()}")


def stored_objects(address: str) -> int:
    """Objects the GCache server at ``address`` holds."""
    from gcache.sdk import Client
    with Client([address], timeout_s=2.0) as client:
        return sum(s["tier"]["objects"] for s in client.server_stats().values() if s)


def remove_server_files(port: int) -> None:
    """What a README's ``gcache-server --listen 127.0.0.1:PORT`` leaves behind by design."""
    for leftover in (f"/dev/shm/gcache-{port}", f"/dev/shm/gcache-{port}.key",
                     f"/dev/shm/gcache-{port}.id",
                     f"/tmp/gcache-{port}.sock"):
        try:
            os.unlink(leftover)
        except FileNotFoundError:
            pass


@contextmanager
def recipe_running(readme: pathlib.Path, gcache_block: str, engine_block: str, *, port: int,
                   url: str, model: pathlib.Path, logs: pathlib.Path) -> Iterator[Shell]:
    """A README's recipe as printed: block ``gcache_block`` (a gcache-server on ``port``), then
    ``engine_block`` with ``MODEL`` set, until the engine answers at ``url``; yields the
    engine's shell. On the way out the engine is stopped and the /dev/shm files its process
    group used removed (an engine ended by a signal leaves its shared memory and semaphores),
    then the server and what it leaves by design."""
    server = Shell(readme_block(readme, gcache_block), logs / "gcache.log", env=activated())
    try:
        server.wait_for("gcache-server ready", 60)
        before = names()
        engine = Shell(readme_block(readme, engine_block), logs / f"{engine_block}.log",
                       env={**activated(), "MODEL": str(model)})
        files = GroupFiles(engine.proc.pid, before)
        try:
            wait_healthy(url, engine)
            files.collect()
            yield engine
        finally:
            files.collect()
            engine.stop()
            files.remove()
    finally:
        server.stop()
        remove_server_files(port)
