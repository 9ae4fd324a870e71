"""vLLM's real scheduler on CPU (vllm 0.33.0, no engine), with our connector on both sides.

The scheduler is vLLM's own ``Scheduler`` over a ``KVCacheConfig`` we lay out (a full-attention
group and, for hybrid models, a sliding-window group, in either order). The worker side is our
connector in the WORKER role over CPU tensors shaped as vLLM hands them over
(``[blocks, kv heads, block tokens, K‖V]``), inside a one-process gloo group.
"""

from __future__ import annotations

import json
import os
import pathlib
import time

import torch

PAGE = 16
BLOCKS = 128
STEPS = 200                       # a bound on any wait for the engine: about 4 s


def write_config(path: pathlib.Path, *, window: int | None, sliding_first: bool = True,
                 layers: int = 4, heads: int = 2, head_dim: int = 32) -> pathlib.Path:
    """A Llama-shaped config (or Gemma 3 with ``layer_types`` when there is a window); the
    scheduler needs no weights."""
    path.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": heads * head_dim, "intermediate_size": 128,
              "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": heads, "head_dim": head_dim, "vocab_size": 512,
              "max_position_embeddings": 1024, "torch_dtype": "float32", "rms_norm_eps": 1e-6}
    if window:
        kinds = ["sliding_attention", "full_attention"]
        if not sliding_first:
            kinds.reverse()
        config.update(architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                      sliding_window=window, query_pre_attn_scalar=head_dim,
                      layer_types=[kinds[i % 2] for i in range(layers)])
    (path / "config.json").write_text(json.dumps(config))
    return path


def layer_name(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def vllm_config(model: pathlib.Path, servers: list[str], *, policy: str = "adaptive",
                tp_size: int = 1, **settings):
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    model_config = ModelConfig(model=str(model), tokenizer=None, skip_tokenizer_init=True,
                               dtype="float32", max_model_len=1024)
    return VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(block_size=PAGE, enable_prefix_caching=False),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2048,
                                         max_model_len=1024, is_encoder_decoder=False),
        parallel_config=ParallelConfig(tensor_parallel_size=tp_size),
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="GCacheConnector", kv_connector_module_path="gcache_vllm.connector",
            kv_role="kv_both", kv_load_failure_policy="recompute",
            # a generous IO timeout (the probe's bound too): in make test the other core runs
            # vLLM engines, and a probe that outlives it turns a test's hit into a miss
            kv_connector_extra_config={"gcache_servers": ",".join(servers),
                                       "gcache_timeout_ms": 5000, "gcache_policy": policy,
                                       **{f"gcache_{k}": v for k, v in settings.items()}}))


def kv_cache_config(config: dict, *, heads: int, head_dim: int):
    """Groups as vLLM's hybrid allocator makes them: one per attention kind, in layer order of
    first appearance."""
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )
    kinds = config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"]
    groups: dict[str, list[str]] = {}
    for i, kind in enumerate(kinds):
        groups.setdefault(kind, []).append(layer_name(i))
    specs = []
    for kind, names in groups.items():
        if kind == "sliding_attention":
            spec = SlidingWindowSpec(block_size=PAGE, num_kv_heads=heads, head_size=head_dim,
                                     dtype=torch.float32, sliding_window=config["sliding_window"])
        else:
            spec = FullAttentionSpec(block_size=PAGE, num_kv_heads=heads, head_size=head_dim,
                                     dtype=torch.float32)
        specs.append(KVCacheGroupSpec(names, spec))
    return KVCacheConfig(num_blocks=BLOCKS, kv_cache_tensors=[], kv_cache_groups=specs)


MADE: list = []             # connectors made by a test; conftest shuts them down after it


def scheduler(config, kv_config):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager
    config.cache_config.num_gpu_blocks = kv_config.num_blocks
    made = Scheduler(vllm_config=config, kv_cache_config=kv_config,
                     structured_output_manager=StructuredOutputManager(config),
                     block_size=PAGE, log_stats=True)
    MADE.append(made.connector)
    return made


def request(req_id: str, tokens: list[int], *, max_tokens: int = 4):
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request
    init_none_hash(sha256)
    return Request(req_id, tokens, SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                      ignore_eos=True), None,
                   block_hasher=get_request_block_hasher(PAGE, sha256))


def kv_tensors(names: list[str], *, heads: int, head_dim: int, seed: int | None):
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    shape = (BLOCKS, heads, PAGE, 2 * head_dim)
    return {n: (torch.randn(shape, generator=generator) if seed is not None
                else torch.zeros(shape)) for n in names}


def init_one_process_group() -> None:
    """vLLM's parallel state for one CPU process (the worker side asks for its TP rank)."""
    from vllm.distributed.parallel_state import (
        ensure_model_parallel_initialized,
        init_distributed_environment,
        model_parallel_is_initialized,
    )
    if model_parallel_is_initialized():
        return
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from vllm.config import VllmConfig, set_current_vllm_config
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"tcp://127.0.0.1:{port}",
                                     backend="gloo")
        ensure_model_parallel_initialized(1, 1)


def forward(config, out, connector, *, between=None):
    """The model runner's forward pass over ``out``: each attention layer's hooks, in layer
    order, inside vLLM's own connector context; returns its ``KVConnectorOutput``."""
    from vllm.forward_context import set_forward_context
    from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
    layers = sorted(connector.worker.layers, key=lambda n: connector.worker.layers[n][0])
    with set_forward_context(None, config), \
            KVConnectorModelRunnerMixin._get_kv_connector_output(out) as kv_output:
        for name in layers:                               # what attention layers call
            connector.wait_for_layer_load(name)
            connector.save_kv_layer(name, connector.worker.layers[name][1].tensor, None)
        if between is not None:
            between()
    return kv_output


def engine_step(config, sched, connector, *, token: int = 7):
    """One whole engine step; each scheduled request samples ``token``."""
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.worker.kv_connector_model_runner_mixin import KVConnectorModelRunnerMixin
    out = sched.schedule()
    if not out.total_num_scheduled_tokens:
        output = KVConnectorModelRunnerMixin.kv_connector_no_forward(out, config)
    else:
        req_ids = list(out.num_scheduled_tokens)
        output = ModelRunnerOutput(req_ids=req_ids,
                                   req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                   sampled_token_ids=[[token] for _ in req_ids],
                                   kv_connector_output=forward(config, out, connector))
    sched.update_from_output(out, output)
    return out


def until_scheduled(config, sched, connector, req_id: str, *, seen=None):
    """Whole engine steps until ``req_id`` is scheduled (an async load parks it a while);
    ``seen`` collects every step's loads."""
    for _ in range(STEPS):
        out = engine_step(config, sched, connector)
        if seen is not None:
            seen.extend(out.kv_connector_metadata.loads)
        if req_id in out.num_scheduled_tokens:
            return out
        time.sleep(0.02)
    raise AssertionError(f"{req_id} was never scheduled")
