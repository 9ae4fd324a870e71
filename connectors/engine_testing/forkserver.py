"""Engine processes forked from one that has imported the engine already.

An engine process spends 12-16 s of CPU importing vLLM, or SGLang's server, before it does
anything (on the test machines' cores), and an engine test starts two or three of them.
``Forkserver`` imports the engine's modules once, in a process of its own, and forks a child
per engine: a fresh process with its own ``__main__`` (``python -m MODULE`` or ``python
SCRIPT``), arguments, environment and output, in a session of its own (its workers in its
group), as ``run_group`` and the engine harnesses start one, less the import. vLLM forks its
own workers and engine core the same way on CPU hosts; SGLang still spawns its scheduler and
detokenizer fresh.

Rules of the fork, and why:
- The server imports only: it runs no model and starts no thread of ours, so a child never
  inherits a lock held by a thread that does not exist in it, nor an OpenMP pool.
- Requests and replies travel on the server's stdin and a copy of its first stdout; its fd 1 is
  pointed at its log before the first import, so what an import prints never meets a reply.
- The child points fds 0, 1, 2 at /dev/null and its log, flushes what Python buffered, and
  leaves with ``os._exit`` after its ``__main__``: nothing of the server runs in it afterwards.

Protocol: a JSON line ``{"argv", "env", "log"}`` in; ``pid PID`` when forked, and ``exit PID
STATUS`` (``os.waitstatus_to_exitcode``) when the server reaps it, out. Children may overlap.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import queue
import runpy
import select
import signal
import subprocess
import sys
import threading
import time
import traceback

from engine_testing.shm import GroupFiles, names

READY = b"ready\n"


class Child:
    """A forked engine, as much of ``subprocess.Popen`` as the harnesses use."""

    def __init__(self, server: Forkserver, pid: int) -> None:
        self.server, self.pid = server, pid

    def poll(self) -> int | None:
        return self.server.status(self.pid, 0.0)

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def wait(self, timeout: float | None = None) -> int:
        status = self.server.status(self.pid, timeout)
        if status is None:
            raise subprocess.TimeoutExpired(f"forked {self.pid}", timeout or 0.0)
        return status


class Forkserver:
    """``python -m engine_testing.forkserver MODULE...`` with ``env``; ``start`` forks one
    engine, ``run`` one to its end."""

    def __init__(self, preload: list[str], *, env: dict[str, str], log: pathlib.Path,
                 timeout_s: float = 300.0) -> None:
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine_testing.forkserver", *preload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
            start_new_session=True)
        self._forked: queue.Queue[int] = queue.Queue()
        self._exits: dict[int, int] = {}
        self._changed = threading.Condition()
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready or self.proc.stdout.readline() != READY:
            self.close()
            raise RuntimeError(f"the forkserver did not start: {log.read_text()[-3000:]}")
        self._reader = threading.Thread(target=self._read, name="forkserver-replies",
                                        daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            kind, *fields = line.split()
            if kind == b"pid":
                self._forked.put(int(fields[0]))
            elif kind == b"exit":
                with self._changed:
                    self._exits[int(fields[0])] = int(fields[1])
                    self._changed.notify_all()
        with self._changed:                          # the server is gone
            self._changed.notify_all()

    def status(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s exit status once the server reaped it, waiting up to ``timeout``."""
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits or self.proc.poll() is not None,
                                   timeout)
            return self._exits.get(pid)

    def start(self, argv: list[str], *, env: dict[str, str], log: pathlib.Path) -> Child:
        """Fork ``python ARGV`` (``-m MODULE ARGS`` or ``SCRIPT ARGS``), its output in ``log``."""
        assert self.proc.stdin is not None
        request = {"argv": argv, "env": env, "log": str(log)}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        try:
            return Child(self, self._forked.get(timeout=60.0))
        except queue.Empty:
            raise RuntimeError("the forkserver did not fork: "
                               f"{pathlib.Path(self._log.name).read_text()[-3000:]}") from None

    def run(self, argv: list[str], *, env: dict[str, str], log: pathlib.Path,
            timeout_s: float) -> int:
        """``start`` and wait for the end; returns the exit status. As ``run_group``: past
        ``timeout_s`` the group is killed (``TimeoutError``), and the engine files the group
        used are removed once no process uses them."""
        before = names()
        child = self.start(argv, env=env, log=log)
        files = GroupFiles(child.pid, before)
        deadline = time.monotonic() + timeout_s
        try:
            while (status := self.status(child.pid, 2.0)) is None:
                files.collect()
                if self.proc.poll() is not None:
                    raise RuntimeError("the forkserver died during a run")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{' '.join(argv[:2])} ran over {timeout_s} s")
            return status
        finally:
            files.end(child)                          # its workers, if any outlived it

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self._log.close()


def _child(request: dict, replies: int) -> None:
    """In the forked child: become the engine's own process, run its ``__main__``, leave."""
    code = 1
    try:
        os.setsid()
        os.close(replies)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        # what the engine's own PYTHONPATH would have put on its path (the server's is there)
        sys.path[:0] = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                        if p and p not in sys.path]
        argv = request["argv"]
        if argv[0] == "-m":                          # as ``python -m`` sets them
            sys.argv, sys.path[:0] = [argv[1], *argv[2:]], [os.getcwd()]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv, sys.path[:0] = list(argv), [os.path.dirname(argv[0])]
            runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def serve(preload: list[str]) -> None:
    replies = os.dup(1)
    os.dup2(2, 1)                                  # an import's prints go to the log
    for name in preload:
        importlib.import_module(name)
    os.write(replies, READY)
    pending, children, open_ = b"", set(), True
    while open_ or children:
        if open_ and select.select([0], [], [], 0.1)[0]:
            chunk = os.read(0, 1 << 16)
            open_ = bool(chunk)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    _child(json.loads(line), replies)
                children.add(pid)
                os.write(replies, f"pid {pid}\n".encode())
        elif not open_:
            time.sleep(0.1)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            os.write(replies, f"exit {pid} {os.waitstatus_to_exitcode(status)}\n".encode())


if __name__ == "__main__":
    serve(sys.argv[1:])
