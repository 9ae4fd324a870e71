"""A ``Client`` from an engine's plugin settings: the ``gcache_*`` keys of its extra config.

Both engines pass a free-form dict to their plugin (SGLang's storage-backend extra config,
vLLM's ``kv_connector_extra_config``); the connectors share one reading of it, so an operator
writes the same keys for either engine. Every setting is checked here and a wrong one raises
``ConfigError`` naming the key, at engine start rather than at the first request.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gcache.config import ClientConfig
from gcache.config_loader import load_config
from gcache.errors import ConfigError
from gcache.sdk import Client

PREFIX = "gcache_"

SETTINGS = {
    "master": "masters' gRPC HOST:PORT, comma separated (dynamic membership)",
    "servers": "data servers' HOST:PORT, a list or comma separated (static membership)",
    "token": "the cluster token, when the servers require one; or a tenant's token (gcache "
             "tenant add): then every key this engine reads or writes is that tenant's alone, "
             "within its quotas, and its values move over TCP (docs/operations.md, Tenants)",
    "timeout_ms": "milliseconds one IO may take before it is a miss (default 200)",
    "transport": "auto (shm for same-host servers, else tcp), tcp or shm",
    "io_threads": "SDK IO threads (default 4)",
    "verify_arena_reads": "true: also hash values copied out of a server's arena (shm, NIXL); "
                          "default false: the server hashed them at COMMIT (docs/protocol.md)",
    "group_width": "servers one placement group is striped over (default 2; with masters, "
                   "the masters' --group-width in the cluster map wins)",
    "namespace": "an extra label in the keys, separating engines' names (not their rights "
                 "or memory: a tenant's token does that)",
    "group_head_tokens": "tokens at the start of a sequence placed with its first page (the "
                         "shared head, e.g. a system prompt: make it cover the longest one); "
                         "deeper pages go with the first page past it (default 1024; "
                         "gcache.kv.page_keys)",
    "async_load_tokens": "vLLM: hits of more tokens than this load asynchronously, beside the "
                         "forward passes (default 2048; 0: every hit)",
    "pinned_mb": "vLLM: host memory one worker may pin for staging, in MiB (default 4096)",
    "switch_interval_us": "vLLM: the worker process's GIL switch interval in microseconds, "
                          "lowered to this at most (default 200; 0: left as it is)",
    "recompute_tokens_per_s": "vLLM: the engine's prefill rate in tokens per second (measured, "
                              "e.g. from a miss's time to first token); a hit whose measured "
                              "load would take longer is recomputed instead (default 0: "
                              "unknown, always load; gcache.kv.LoadCost)",
    "policy": "where sliding layers' window tails are saved: adaptive (default), tail, "
              "checkpoint-K or full-layer (gcache.kv.policy_from_name)",
    "engine_url": "vLLM: this engine's OpenAI API as others reach it (http://HOST:PORT), "
                  "announced to the masters so that gcache-router finds it (needs "
                  "gcache_master; default: not announced)",
    "engine_bucket": "vLLM: the length bucket whose pool this engine serves (default 0)",
    "name": "vLLM model loader (--load-format gcache): the name the model's directory was "
            "pushed under (gcache files push DIR --name NAME)",
    "prefetch_mb": "vLLM model loader: MiB of weights read ahead while earlier tensors are "
                   "copied into the model (default 256)",
    "host_cache": "vLLM model loader: true to read chunks from this host's own server first "
                  "and copy there those read from others, so the next engine on this host "
                  "loads from shared memory (default false; gcache.files host cache)",
}
# Settings only the model loader reads, and those only the KV connectors read: each refuses the
# other's by name.
LOADER_ONLY = ("name", "prefetch_mb", "host_cache")
KV_ONLY = ("namespace", "group_head_tokens", "async_load_tokens", "pinned_mb",
           "switch_interval_us", "recompute_tokens_per_s", "policy", "engine_url",
           "engine_bucket")


def gcache_settings(extra: Mapping[str, Any] | None, *,
                    unused: Iterable[str] = ()) -> dict[str, Any]:
    """The ``gcache_*`` entries of ``extra`` without their prefix. An unknown one raises, and so
    does one in ``unused`` (a setting the calling connector has no use for: silently ignoring it
    would let an operator believe it took effect)."""
    out = {}
    refused = set(unused)
    for key, value in (extra or {}).items():
        if not isinstance(key, str) or not key.startswith(PREFIX):
            continue
        name = key[len(PREFIX):]
        if name not in SETTINGS:
            known = ", ".join(PREFIX + k for k in SETTINGS if k not in refused)
            raise ConfigError(key, value, f"unknown setting; known: {known}")
        if name in refused:
            raise ConfigError(key, value, "this connector does not use it (remove it)")
        out[name] = value
    return out


# Engine settings that are ``ClientConfig`` fields, by setting name; ``timeout_ms`` is the one in
# other units (engines' configs count IO deadlines in milliseconds).
_CLIENT_FIELDS = {"master": "master", "servers": "servers", "token": "token",
                  "transport": "transport", "io_threads": "io_threads",
                  "verify_arena_reads": "verify_arena_reads", "group_width": "group_width",
                  "timeout_ms": "timeout_s"}


def client_config(settings: Mapping[str, Any]) -> ClientConfig:
    """The ``ClientConfig`` that settings as ``gcache_settings`` returns them describe, read by
    the daemons' own loader: defaults < ``GCACHE_CLIENT_*`` and ``GCACHE_TOKEN`` in the
    engine's environment (so a token need not sit in an engine's command line) < the settings.
    A wrong one raises ``ConfigError`` naming its ``gcache_`` key."""
    if not settings.get("servers") and not settings.get("master"):
        raise ConfigError("gcache_master", settings.get("master"), "set gcache_master "
                          "(masters' HOST:PORT) or gcache_servers (data servers' HOST:PORT) in "
                          "the extra config")
    flags = {field: settings[name] for name, field in _CLIENT_FIELDS.items()
             if settings.get(name) is not None}
    if "timeout_s" in flags:
        flags["timeout_s"] = _number(settings, "timeout_ms", positive=True) / 1000.0
    try:
        return load_config(ClientConfig, "client", flags=flags)
    except ConfigError as exc:
        setting = next((n for n, f in _CLIENT_FIELDS.items() if f == exc.key), exc.key)
        raise ConfigError(PREFIX + setting, exc.value, exc.rule) from None


def client_from_settings(settings: Mapping[str, Any]) -> Client:
    """A ``Client`` for settings as ``gcache_settings`` returns them."""
    config = client_config(settings)
    try:
        return Client(config=config)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError("gcache_*", dict(settings), str(exc)) from exc


def count_setting(settings: Mapping[str, Any], name: str, default: int, *,
                  minimum: int = 0) -> int:
    """The whole number ``name`` of settings as ``gcache_settings`` returns them, at least
    ``minimum``, or ``default``; anything else raises ``ConfigError`` naming the key."""
    value = settings.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(PREFIX + name, value, f"must be a whole number, {minimum} or more")
    return value


def flag_setting(settings: Mapping[str, Any], name: str, default: bool) -> bool:
    """The true-or-false ``name`` (a JSON boolean, or "true" / "false"), or ``default``;
    anything else raises ``ConfigError`` naming the key."""
    value = settings.get(name, default)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if not isinstance(value, bool):
        raise ConfigError(PREFIX + name, value, "must be true or false")
    return value


def _number(settings: Mapping[str, Any], name: str, *, positive: bool) -> float:
    value = settings[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (positive and value <= 0):
        raise ConfigError(PREFIX + name, value, "must be a positive number")
    return float(value)
