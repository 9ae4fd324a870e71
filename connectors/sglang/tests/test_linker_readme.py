"""The linker recipe of docs/engines/sglang-linker.md, run exactly as printed: a GCache server,
then SGLang with GCache as its external cache linker on a tiny model. A request, ``/flush_cache``,
the same request: the prefix comes back from GCache into the engine's KV pool and the tokens are
Hugging Face's. The page's GPU command is checked with SGLang's own argument parser (no GPU
here)."""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import time
import urllib.request

import pytest
from engine_testing.readme import readme_block, recipe_running, stored_objects
from engine_testing.tiny_models import hf_greedy, llama, prompt_ids

README = pathlib.Path(__file__).resolve().parents[3] / "docs" / "engines" / "sglang-linker.md"
GCACHE, URL, PAGE = "127.0.0.1:7711", "http://127.0.0.1:30711", 16

pytestmark = pytest.mark.timeout(600)


def post(path: str, body: dict) -> bytes:
    request = urllib.request.Request(URL + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        return reply.read()


def test_the_linker_recipe_runs_as_printed(tmp_path):
    model = llama(tmp_path / "tiny-llama")
    ids = prompt_ids(model)
    reference = hf_greedy(model, ids, 8)
    pages = len(ids) // PAGE
    generate = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 8,
                                                      "ignore_eos": True}}
    with recipe_running(README, "linker-cpu-gcache", "linker-cpu-sglang", port=7711, url=URL,
                        model=model, logs=tmp_path) as engine:
        assert json.loads(post("/generate", generate))["output_ids"] == reference
        deadline = time.monotonic() + 30                # the linker offloads after the insert
        while stored_objects(GCACHE) < 2 * 2 * pages and time.monotonic() < deadline:
            time.sleep(0.3)
        assert stored_objects(GCACHE) >= 2 * 2 * pages, engine.log()   # K, V of 2 layers
        deadline = time.monotonic() + 30
        while b"Cache flushed" not in post("/flush_cache", {}):
            assert time.monotonic() < deadline, engine.log()
            time.sleep(0.5)                             # refused while offloads are in flight
        again = json.loads(post("/generate", generate))
        assert again["meta_info"]["cached_tokens_details"] == {"device": 0, "host": pages * PAGE}
        assert again["output_ids"] == reference


def test_the_gpu_command_parses_as_sglang_reads_it():
    from sglang.srt.arg_groups.hicache_hook import handle_hicache
    from sglang.srt.mem_cache.unified_cache.linker_config import UnifiedCacheLinkerConfig
    from sglang.srt.server_args import ServerArgs

    from gcache.kv import gcache_settings
    from gcache_sglang.linker import REFUSED

    words = shlex.split(readme_block(README, "linker-gpu").replace("\\\n", " "))
    assert words[:3] == ["python", "-m", "sglang.launch_server"]
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    parsed = parser.parse_args(words[3:])
    assert parsed.enable_unified_cache_external_linker
    assert parsed.unified_cache_external_linker_backend == "dynamic"
    config = UnifiedCacheLinkerConfig.from_dict(parsed.unified_cache_external_linker_config)
    assert (config.linker_module_path, config.linker) == ("gcache_sglang.linker", "GCacheLinker")
    assert gcache_settings(config.linker_extra_config, unused=REFUSED)["master"]
    handle_hicache(ServerArgs(model_path="dummy", enable_unified_cache_external_linker=True,
                              unified_cache_external_linker_backend="dynamic",
                              unified_cache_external_linker_config=parsed
                              .unified_cache_external_linker_config))
