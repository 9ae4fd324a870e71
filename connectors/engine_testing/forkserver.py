"""Engine processes forked from one that has imported the engine already.

A vLLM engine process spends 12-16 s of CPU importing vLLM before it does anything (on the
test machines' cores), and an engine test starts two or three of them. ``Forkserver`` imports
the engine's modules once, in a process of its own, and forks a child per run: the child is a
fresh process with the script's own ``__main__``, arguments, environment and output, in a
session of its own (its workers in its group), exactly as ``run_group`` runs a command, less
the import. vLLM forks its own workers and engine core the same way on CPU hosts.

Rules of the fork, and why:
- The server imports only: it runs no model and starts no thread of ours, so a child never
  inherits a lock held by a thread that does not exist in it, nor an OpenMP pool.
- Requests and replies travel on the server's stdin and a copy of its first stdout; its fd 1 is
  pointed at its log before the first import, so what an import prints never meets a reply.
- The child points fds 0, 1, 2 at /dev/null and its log, flushes what Python buffered, and
  leaves with ``os._exit`` after its script: nothing of the server runs in it afterwards.

Protocol: a JSON line ``{"script", "argv", "env", "log"}`` in; the child's PID, then its exit
status (``os.waitstatus_to_exitcode``), each on a line of their own, out. One run at a time.
"""

from __future__ import annotations

import importlib
import json
import os
import pathlib
import runpy
import select
import signal
import subprocess
import sys
import time
import traceback

from engine_testing.shm import GroupFiles, names

READY = b"ready\n"


class Forkserver:
    """``python -m engine_testing.forkserver MODULE...`` with ``env``; ``run`` forks a run."""

    def __init__(self, preload: list[str], *, env: dict[str, str], log: pathlib.Path,
                 timeout_s: float = 300.0) -> None:
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine_testing.forkserver", *preload],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, env=env,
            start_new_session=True)
        if self._line(timeout_s) != READY:
            self.close()
            raise RuntimeError(f"the forkserver did not start: {log.read_text()[-3000:]}")

    def _line(self, timeout_s: float) -> bytes:
        """The server's next line, or b'' if it exits or ``timeout_s`` passes first."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        return self.proc.stdout.readline() if ready else b""

    def run(self, script: pathlib.Path, argv: list[str], *, env: dict[str, str],
            log: pathlib.Path, timeout_s: float) -> int:
        """Run ``script`` with ``argv`` in a forked child to its end; returns its exit status.
        As ``run_group``: past ``timeout_s`` the group is killed (``TimeoutError``), and the
        engine files the group used are removed once no process uses them."""
        assert self.proc.stdin is not None
        before = names()
        request = {"script": str(script), "argv": argv, "env": env, "log": str(log)}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        self.proc.stdin.flush()
        pid = int(self._line(60.0) or b"0")
        if pid <= 0:
            raise RuntimeError("the forkserver did not fork: "
                               f"{pathlib.Path(self._log.name).read_text()[-3000:]}")
        files = GroupFiles(pid, before)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                status = self._line(2.0)
                if status:
                    return int(status)
                files.collect()
                if self.proc.poll() is not None:
                    raise RuntimeError("the forkserver died during a run")
                if time.monotonic() > deadline:
                    files.kill()
                    self._line(30.0)                 # the server reaps the child
                    raise TimeoutError(f"{script.name} ran over {timeout_s} s")
        finally:
            files.kill()                             # its workers, if any outlived it
            files.remove()

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
    """In the forked child: become the script's own process, run it, leave."""
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
        script = request["script"]
        sys.argv = [script, *request["argv"]]
        sys.path.insert(0, os.path.dirname(script))   # as ``python script`` puts it
        runpy.run_path(script, run_name="__main__")
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
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, replies)
        os.write(replies, f"{pid}\n".encode())
        _, status = os.waitpid(pid, 0)
        os.write(replies, f"{os.waitstatus_to_exitcode(status)}\n".encode())


if __name__ == "__main__":
    serve(sys.argv[1:])
