"""The CPU recipe of docs/engines/vllm.md, run exactly as printed in vLLM's CPU build: a GCache
server, then vLLM's OpenAI server with GCache as its KV connector on a tiny model; a completion
is answered and the prompt's pages land in GCache."""

from __future__ import annotations

import json
import pathlib
import time
import urllib.request

import pytest
from engine_testing.readme import recipe_running, stored_objects
from engine_testing.tiny_models import llama, prompt_ids

README = pathlib.Path(__file__).resolve().parents[3] / "docs" / "engines" / "vllm.md"
GCACHE, URL = "127.0.0.1:7720", "http://127.0.0.1:30720"

pytestmark = pytest.mark.timeout(600)


def test_the_cpu_recipe_runs_as_printed(tmp_path):
    model = llama(tmp_path / "tiny-llama")
    ids = prompt_ids(model, repeats=2)
    with recipe_running(README, "cpu-gcache", "cpu-vllm", port=7720, url=URL, model=model,
                        logs=tmp_path) as engine:
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
