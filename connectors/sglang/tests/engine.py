"""A real SGLang server on CPU for the engine tier: start, talk HTTP, stop (by our PID only)."""

from __future__ import annotations

import json
import mmap
import os
import pathlib
import subprocess
import sys
import time
import urllib.error
import urllib.request

from engine_testing.forkserver import Child, Forkserver
from engine_testing.shm import GroupFiles, names

from gcache.cli.ports import free_port
from gcache.record_layout import ALIGN, value_offset
from gcache.server.record import PARENT_SHIFT, RECORD, RECORD_MAGIC, STATE_COMMITTED

BACKEND = {"backend_name": "gcache", "module_path": "gcache_sglang.storage",
           "class_name": "GCacheHiCacheStorage", "interface_v1": 1,
           "prefetch_threshold": 16, "hicache_storage_pass_prefix_keys": True}
ADMIN_KEY = "gcache-test-admin"


class Engine:
    """``python -m sglang.launch_server`` on CPU with HiCache (and, unless ``attach_later``,
    our backend), or, given ``linker`` (the ``--unified-cache-external-linker-config``
    object), with no HiCache and GCache as its external cache linker. Its log is kept for the
    test's asserts. Given ``forkserver``, the server process is forked from one that imported
    SGLang's server already (its scheduler and detokenizer are spawned fresh as ever)."""

    def __init__(self, model: pathlib.Path, servers: list[str], log_dir: pathlib.Path, *,
                 tp: int = 1, layout: str = "page_first_direct", attach_later: bool = False,
                 storage_args: tuple[str, ...] | None = None,
                 backend_extra: dict | None = None, linker: dict | None = None,
                 env: dict | None = None, forkserver: Forkserver | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # a generous IO timeout: the test machine's two cores also run other engines
        self.backend_config = {**BACKEND, "gcache_servers": ",".join(servers),
                               "gcache_timeout_ms": 2000, **(backend_extra or {})}
        args = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model),
                "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1",
                "--port", str(self.port), "--disable-overlap-schedule",
                "--max-total-tokens", "4096", "--page-size", "16", "--tp", str(tp),
                "--enable-cache-report", "--enable-metrics", "--admin-api-key", ADMIN_KEY]
        if linker is not None:
            args += ["--enable-unified-cache-external-linker",
                     "--unified-cache-external-linker-backend", "dynamic",
                     "--unified-cache-external-linker-config", json.dumps(linker)]
        else:
            args += ["--enable-hierarchical-cache", "--hicache-ratio", "2",
                     "--hicache-io-backend", "direct", "--hicache-mem-layout", layout,
                     "--hicache-storage-prefetch-policy", "wait_complete"]
            if storage_args is not None:               # another L3 backend, to compare with
                args += list(storage_args)
            elif not attach_later:
                args += ["--hicache-storage-backend", "dynamic",
                         "--hicache-storage-backend-extra-config",
                         json.dumps(self.backend_config)]
        env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "SGLANG_PLUGINS": "cpu_testshim",
               **(env or {})}
        if tp > 1:
            env["SGLANG_CPU_OMP_THREADS_BIND"] = "|".join(str(i % os.cpu_count())
                                                          for i in range(tp))
        self.log_path = log_dir / f"sglang-{self.port}.log"
        self._log = None if forkserver is not None else open(self.log_path, "wb")
        before = names()
        self.proc: subprocess.Popen | Child = (
            forkserver.start(args[1:], env=env, log=self.log_path) if forkserver is not None
            else subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True))
        self.files = GroupFiles(self.proc.pid, before)

    def wait_ready(self, timeout_s: float = 240.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sglang exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        self.files.collect()
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise TimeoutError(f"sglang not ready after {timeout_s}s:\n{self.log()}")

    def log(self, tail: int = 60) -> str:
        lines = self.log_path.read_bytes().decode(errors="replace").splitlines()
        return "\n".join(line[:400] for line in lines[-tail:])

    def request(self, method: str, path: str, body: dict | None = None, *,
                admin: bool = False) -> bytes:
        headers = {"Content-Type": "application/json"}
        if admin:
            headers["Authorization"] = f"Bearer {ADMIN_KEY}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        with urllib.request.urlopen(req, timeout=120) as reply:
            return reply.read()

    def generate(self, ids: list[int], new_tokens: int) -> dict:
        body = {"input_ids": ids, "sampling_params": {"temperature": 0,
                                                       "max_new_tokens": new_tokens,
                                                       "ignore_eos": True}}
        return json.loads(self.request("POST", "/generate", body))

    def flush(self) -> None:
        """Drop the device and host caches (L1, L2); GCache (L3) keeps its pages."""
        reply = self.request("POST", "/flush_cache", {}, admin=True)
        assert b"Cache flushed" in reply, reply

    def metric(self, name: str, **labels: str) -> float:
        text = self.request("GET", "/metrics").decode()
        total = 0.0
        for line in text.splitlines():
            named = line.startswith(name + "{") or line.startswith(name + " ")
            if named and all(f'{k}="{v}"' in line for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        # killed at once, its engine files removed once no process uses them
        # (engine_testing.shm: by inode, not name; other engines on the machine have files of
        # the same shape, and the engine also maps GCache's arena, which is the server's)
        self.files.end(self.proc)
        if self._log is not None:
            self._log.close()


def corrupt_every_value(shm_name: str) -> int:
    """Flip one byte inside every committed value of a live server's arena (the server maps the
    same file, so it serves the flipped bytes); returns how many values were hit."""
    path = f"/dev/shm/{shm_name}"
    hit = 0
    with open(path, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as arena:
        magic = RECORD_MAGIC.to_bytes(4, "little")
        at = arena.find(magic)
        while at >= 0:
            if at % ALIGN == 0 and at + RECORD.size <= len(arena):
                _, state, spare, key_len, length, *_ = RECORD.unpack_from(arena, at)
                start = value_offset(at, key_len + (spare >> PARENT_SHIFT))
                if state == STATE_COMMITTED and length > 0 and start + length <= len(arena):
                    arena[start + length // 2] ^= 0xFF
                    hit += 1
            at = arena.find(magic, at + 4)
    return hit
