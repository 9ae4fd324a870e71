"""The README's CPU recipe, run exactly as printed in vLLM's CPU build: a GCache server, then
vLLM's OpenAI server with GCache as its KV connector on a tiny model; a completion is answered
and the prompt's pages land in GCache."""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
import urllib.error
import urllib.request

import pytest

from gcache.sdk import Client

from engine_testing.readme import Shell, readme_block
from engine_testing.tiny_models import llama, prompt_ids

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
GCACHE, URL = "127.0.0.1:7720", "http://127.0.0.1:30720"

pytestmark = pytest.mark.timeout(600)


def activated() -> dict[str, str]:
    """The environment as if this virtual environment were activated (the README assumes it)."""
    return {"PATH": f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def wait_healthy(shell: Shell, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if shell.proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {shell.proc.returncode}:\n{shell.log()}")
        try:
            with urllib.request.urlopen(URL + "/health", timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise TimeoutError(f"vLLM not healthy after {timeout_s}s:\n{shell.log()}")


def stored_objects() -> int:
    with Client([GCACHE], timeout_s=2.0) as client:
        return sum(s["tier"]["objects"] for s in client.server_stats().values() if s)


def test_the_cpu_recipe_runs_as_printed(tmp_path):
    model = llama(tmp_path / "tiny-llama")
    ids = prompt_ids(model, repeats=2)
    server = Shell(readme_block(README, "cpu-gcache"), tmp_path / "gcache.log", env=activated())
    try:
        server.wait_for("gcache-server ready", 60)
        engine = Shell(readme_block(README, "cpu-vllm"), tmp_path / "vllm.log",
                       env={**activated(), "MODEL": str(model)})
        try:
            wait_healthy(engine)
            body = json.dumps({"model": str(model), "prompt": ids, "max_tokens": 4,
                               "temperature": 0}).encode()
            request = urllib.request.Request(URL + "/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as reply:
                answer = json.loads(reply.read())
            assert answer["choices"] and answer["usage"]["completion_tokens"] == 4
            deadline = time.monotonic() + 30
            while not stored_objects() and time.monotonic() < deadline:
                time.sleep(0.3)
            assert stored_objects() > 0, engine.log()
        finally:
            engine.stop()
    finally:
        server.stop()
        for leftover in ("/dev/shm/gcache-7720", "/dev/shm/gcache-7720.id",
                         "/tmp/gcache-7720.sock"):
            try:
                os.unlink(leftover)
            except FileNotFoundError:
                pass
