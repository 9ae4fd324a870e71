"""The README's CPU recipe, run exactly as printed: a GCache server, then SGLang with GCache as
its L3 on a tiny model; the engine answers with Hugging Face's greedy tokens and its pages land
in GCache."""

from __future__ import annotations

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
from engine_testing.tiny_models import hf_greedy, llama, prompt_ids

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
GCACHE, URL, PAGE = "127.0.0.1:7710", "http://127.0.0.1:30710", 16

pytestmark = pytest.mark.timeout(600)


def test_the_cpu_recipe_runs_as_printed(tmp_path):
    import json
    model = llama(tmp_path / "tiny-llama")
    ids = prompt_ids(model)
    reference = hf_greedy(model, ids, 8)
    server = Shell(readme_block(README, "cpu-gcache"), tmp_path / "gcache.log", env=activated())
    try:
        server.wait_for("gcache-server ready", 60)
        before = names()
        engine = Shell(readme_block(README, "cpu-sglang"), tmp_path / "sglang.log",
                       env={**activated(), "MODEL": str(model)})
        # SGLang's scheduler dies of stop()'s SIGTERM and leaves its semaphore
        files = GroupFiles(engine.proc.pid, before)
        try:
            wait_healthy(URL, engine)
            files.collect()
            body = json.dumps({"input_ids": ids, "sampling_params": {
                "temperature": 0, "max_new_tokens": 8, "ignore_eos": True}}).encode()
            request = urllib.request.Request(URL + "/generate", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as reply:
                assert json.loads(reply.read())["output_ids"] == reference
            deadline = time.monotonic() + 30
            while stored_objects(GCACHE) < 2 * (len(ids) // PAGE) and time.monotonic() < deadline:
                time.sleep(0.3)                     # SGLang backs pages up after the request
            assert stored_objects(GCACHE) >= 2 * (len(ids) // PAGE), engine.log()
        finally:
            files.collect()
            engine.stop()
            files.remove()
    finally:
        server.stop()
        remove_server_files(7710)
