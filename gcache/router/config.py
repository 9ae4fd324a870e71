"""``RouterConfig``: gcache-router's settings, defaults < TOML ``[router]`` < ``GCACHE_ROUTER_*`` <
flags, read by the daemons' own loader (``gcache.config.load_config``).

Instances and models are lists of short strings, so that one syntax serves the TOML file, the
environment and the command line:

- ``instances``: ``URL[;bucket=N][;events=ENDPOINT]``, engines that serve every model.
  ``bucket`` is the index of the length bucket whose pool the instance serves (default 0);
  ``events`` is the ZMQ endpoint its vLLM publishes KV events on (``--kv-events-config``; the
  router connects a SUB socket to it, so the engine must bind: ``tcp://*:PORT`` or
  ``ipc://PATH``). Without ``events`` the router's own routing history feeds that instance's
  view. With ``master`` set, the engines announced there (their connectors'
  ``gcache_engine_url``, ``gcache.kv.engine_announce``) join too, each for the models it
  announced; a configured one wins over an announced one at the same address.
- ``models``: ``NAME=TOKENIZER``: a served model name and the tokenizer folder or hub name whose
  tokenizer and chat template the engines use, so that a prompt's tokens here are the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from gcache.config import _is_address
from gcache.errors import ConfigError
from gcache.router.buckets import Buckets
from gcache.router.policy import PolicyConfig


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    name: str            # host:port of its URL
    url: str             # http://host:port, no trailing slash
    bucket: int
    events: str          # ZMQ endpoint of its KV events; "" when it publishes none


@dataclass(frozen=True)
class RouterConfig:
    listen: str = "127.0.0.1:8100"          # HOST:PORT of the OpenAI-compatible API
    instances: tuple[str, ...] = ()         # URL[;bucket=N][;events=ENDPOINT] per engine
    models: tuple[str, ...] = ()            # NAME=TOKENIZER per served model
    block_size: int = 16                    # the engines' KV block size (vLLM's default)
    servers: tuple[str, ...] = ()           # GCache data servers (static membership)
    master: tuple[str, ...] = ()            # or GCache masters (dynamic membership)
    token: str | None = None                # the GCache cluster token
    gcache_timeout_s: float = 0.2           # one GCache lookup IO, then a miss
    buckets: tuple[str, ...] = ("65536", "262144", "1048576")   # upper bounds, tokens
    health_interval_s: float = 2.0          # seconds between engine health checks
    health_timeout_s: float = 2.0           # one health check, then the instance is down
    upstream_connect_s: float = 5.0         # connecting to an engine, then fail over
    upstream_read_s: float = 600.0          # longest silence from an engine (before its first
                                            # byte: a whole unstreamed answer), then it failed
    hang_hold_s: float = 30.0               # an engine that went silent that long stays out
                                            # of rotation this long (doubling while it does so
                                            # again), whatever its health checks say
    view_capacity_pages: int = 1_000_000    # pages each instance's view holds at most
    view_stale_after_s: float = 600.0       # a page not re-stored for this long stops counting
    host_credit: float = 0.8                # policy knobs (gcache.router.policy.PolicyConfig)
    gcache_credit: float = 0.6
    decode_tokens: float = 512.0
    spread_tokens: int = 16_384
    override_tokens: int = 16_384

    def __post_init__(self) -> None:
        if not _is_address(self.listen):
            raise ConfigError("listen", self.listen, "must be HOST:PORT")
        if not self.instances and not self.master:
            raise ConfigError("instances", self.instances, "name at least one engine "
                              "(URL[;bucket=N][;events=ENDPOINT]), or the masters the engines "
                              "announce themselves to (master)")
        if not self.models:
            raise ConfigError("models", self.models, "name at least one model (NAME=TOKENIZER)")
        for key, value in (("block_size", self.block_size),
                           ("view_capacity_pages", self.view_capacity_pages)):
            if value < 1:
                raise ConfigError(key, value, "must be at least 1")
        for key, seconds in (("gcache_timeout_s", self.gcache_timeout_s),
                             ("health_interval_s", self.health_interval_s),
                             ("health_timeout_s", self.health_timeout_s),
                             ("upstream_connect_s", self.upstream_connect_s),
                             ("upstream_read_s", self.upstream_read_s),
                             ("hang_hold_s", self.hang_hold_s),
                             ("view_stale_after_s", self.view_stale_after_s)):
            if not seconds > 0:
                raise ConfigError(key, seconds, "must be a positive number of seconds")
        self.instance_specs()
        self.model_tokenizers()
        self.policy()

    def instance_specs(self) -> list[InstanceSpec]:
        specs = [_instance(entry) for entry in self.instances]
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ConfigError("instances", self.instances, "an engine is named twice")
        bounds = len(self.policy().buckets)
        for spec in specs:
            if not 0 <= spec.bucket < bounds:
                raise ConfigError("instances", spec.url, f"bucket={spec.bucket}: there are "
                                  f"{bounds} buckets, 0..{bounds - 1}")
        return specs

    def model_tokenizers(self) -> dict[str, str]:
        out = {}
        for entry in self.models:
            name, sep, tokenizer = entry.partition("=")
            if not sep or not name.strip() or not tokenizer.strip():
                raise ConfigError("models", entry, "must be NAME=TOKENIZER (a served model "
                                  "name and its tokenizer's folder or hub name)")
            out[name.strip()] = tokenizer.strip()
        return out

    def policy(self) -> PolicyConfig:
        try:
            bounds = tuple(int(b) for b in self.buckets)
        except ValueError:
            raise ConfigError("buckets", self.buckets, "must be whole numbers of tokens") from None
        return PolicyConfig(buckets=Buckets(bounds), host_credit=self.host_credit,
                            gcache_credit=self.gcache_credit, decode_tokens=self.decode_tokens,
                            spread_tokens=self.spread_tokens,
                            override_tokens=self.override_tokens)


def announced(url: str, bucket: int, events: str) -> InstanceSpec:
    """The spec of an engine announced to the masters (they checked its URL)."""
    parts = urlsplit(url)
    return InstanceSpec(f"{parts.hostname}:{parts.port}", url, bucket, events)


def _instance(entry: str) -> InstanceSpec:
    url, *options = [part.strip() for part in entry.split(";")]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None \
            or parts.path.strip("/"):
        raise ConfigError("instances", entry, "must start with an engine's base URL, "
                          "http://HOST:PORT")
    bucket, events = 0, ""
    for option in options:
        key, sep, value = option.partition("=")
        if key == "bucket" and sep and value.isdigit():
            bucket = int(value)
        elif key == "events" and sep and value.startswith(("tcp://", "ipc://")):
            events = value
        else:
            raise ConfigError("instances", entry, f"unknown option {option!r}; options are "
                              "bucket=N and events=tcp://HOST:PORT or ipc://PATH")
    return InstanceSpec(f"{parts.hostname}:{parts.port}",
                        f"{parts.scheme}://{parts.hostname}:{parts.port}", bucket, events)
