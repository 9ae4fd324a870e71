"""The CPU recipe of docs/engines/sglang-hicache.md, run exactly as printed: a GCache server, then
SGLang with GCache as its L3 on a tiny model; the engine answers with Hugging Face's greedy tokens
and its pages land in GCache."""

from __future__ import annotations

import pathlib
import time
import urllib.request

import pytest
from engine_testing.readme import recipe_running, stored_objects
from engine_testing.tiny_models import hf_greedy, llama, prompt_ids

README = pathlib.Path(__file__).resolve().parents[3] / "docs" / "engines" / "sglang-hicache.md"
GCACHE, URL, PAGE = "127.0.0.1:7710", "http://127.0.0.1:30710", 16

pytestmark = pytest.mark.timeout(600)


def test_the_cpu_recipe_runs_as_printed(tmp_path):
    import json
    model = llama(tmp_path / "tiny-llama")
    ids = prompt_ids(model)
    reference = hf_greedy(model, ids, 8)
    with recipe_running(README, "cpu-gcache", "cpu-sglang", port=7710, url=URL, model=model,
                        logs=tmp_path) as engine:
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
