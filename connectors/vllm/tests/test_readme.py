"""The README's CPU recipe, run exactly as printed in vLLM's CPU build: a GCache server, then
vLLM's OpenAI server with GCache as its KV connector on a tiny model; a completion is answered
and the prompt's pages land in GCache."""

from __future__ import annotations

import json
import pathlib
import time
import urllib.request

import pytest
from engine_testing.readme import (
    Shell,
    activated,
    readme_block,
    remove_server_files,
    stored_objects,
    wait_healthy,
)
from engine_testing.shm import GroupFiles, names
from engine_testing.tiny_models import llama, prompt_ids

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
GCACHE, URL = "127.0.0.1:7720", "http://127.0.0.1:30720"

pytestmark = pytest.mark.timeout(600)


def test_the_cpu_recipe_runs_as_printed(tmp_path):
    model = llama(tmp_path / "tiny-llama")
    ids = prompt_ids(model, repeats=2)
    server = Shell(readme_block(README, "cpu-gcache"), tmp_path / "gcache.log", env=activated())
    try:
        server.wait_for("gcache-server ready", 60)
        before = names()
        engine = Shell(readme_block(README, "cpu-vllm"), tmp_path / "vllm.log",
                       env={**activated(), "MODEL": str(model)})
        # the shared memory and semaphores of whatever stop() has to SIGKILL after the grace
        files = GroupFiles(engine.proc.pid, before)
        try:
            wait_healthy(URL, engine)
            files.collect()
            body = json.dumps({"model": str(model), "prompt": ids, "max_tokens": 4,
                               "temperature": 0}).encode()
            request = urllib.request.Request(URL + "/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as reply:
                answer = json.loads(reply.read())
            assert answer["choices"] and answer["usage"]["completion_tokens"] == 4
            deadline = time.monotonic() + 30
            while not stored_objects(GCACHE) and time.monotonic() < deadline:
                time.sleep(0.3)
            assert stored_objects(GCACHE) > 0, engine.log()
        finally:
            files.collect()
            engine.stop()
            files.remove()
    finally:
        server.stop()
        remove_server_files(7720)
