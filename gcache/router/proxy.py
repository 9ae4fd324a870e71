"""gcache-router's HTTP side: an OpenAI-compatible proxy that routes each request with ``route``.

Built on aiohttp: one asyncio loop serves clients and streams from engines chunk by chunk (an
SSE stream passes through byte for byte, never buffered), it is a well-kept library that vLLM
itself depends on, and one package gives both the server and the client with connection pools.
Tokenizing and GCache lookups are blocking, so they run in a small thread pool.

A request: parse (malformed JSON, a non-object, an unknown model: an OpenAI-style error body),
tokenize as the engine will (``prompts``), ask GCache for its window-safe hit (``gcache_hits``),
snapshot every instance (its view's GPU and host hits, its load), ``route``, have GCache promote
the hit from its cold tier when the engine will read it (in the background), forward. Failover:
an engine that cannot be reached, or that drops the connection before the first byte of its
answer, is marked down and the request is routed again among the others; once bytes have been
passed to the client nothing can be retried, so a stream that breaks ends with an error event
(``data: {"error": ...}``) and a non-streaming answer with a 502. The response carries
``x-gcache-route``: the instance, the policy's reason, the bucket and the hits it routed on.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import REGISTRY, Counter, Gauge, generate_latest

from gcache.errors import GCacheError, InvalidRequest, NoInstance
from gcache.master_client import MasterClient
from gcache.proto import master_pb2 as pb
from gcache.router.config import InstanceSpec, RouterConfig, announced
from gcache.router.gcache_hits import GCacheHits
from gcache.router.instances import Instance
from gcache.router.kv_events import view_hashes
from gcache.router.policy import route
from gcache.router.prompts import Tokenizers, lookup_tokens, prompt_tokens

log = logging.getLogger(__name__)

ROUTED = Counter("gcache_router_requests_total", "requests routed, by instance and reason",
                 ["instance", "reason"])
FAILOVERS = Counter("gcache_router_failovers_total",
                    "requests routed again after their engine could not answer", ["instance"])
REFUSED = Counter("gcache_router_refused_total", "requests answered with an error by the router",
                  ["status"])
UP = Gauge("gcache_router_instance_up", "1 while an instance passes its health checks",
           ["instance"])
QUEUED = Gauge("gcache_router_queued_prefill_tokens",
               "uncached prompt tokens sent to an instance whose answer has not begun",
               ["instance"])
DECODING = Gauge("gcache_router_running_decodes",
                 "requests an instance is answering (first bytes passed on, not ended)",
                 ["instance"])
GCACHE_HIT = Counter("gcache_router_gcache_hit_tokens_total",
                     "prompt tokens GCache could restore, over routed requests")
PROMPT = Counter("gcache_router_prompt_tokens_total", "prompt tokens of routed requests")

# An engine that is gone, refuses, resets or times out (TimeoutError is an OSError).
UPSTREAM_ERRORS = (aiohttp.ClientError, OSError)

SLOW_CHECKS_DOWN = 2

ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 502: "BadGatewayError",
               503: "ServiceUnavailableError"}


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "Error"),
                      "param": None, "code": status}}


def error_response(status: int, message: str) -> web.Response:
    REFUSED.labels(str(status)).inc()
    return web.json_response(error_body(status, message), status=status)


def _publish_load(instance: Instance) -> None:
    QUEUED.labels(instance.name).set(instance.queued_prefill_tokens)
    DECODING.labels(instance.name).set(instance.running_decodes)


class Router:
    def __init__(self, config: RouterConfig, hits: GCacheHits) -> None:
        self.config, self.hits = config, hits
        self.policy = config.policy()
        self.tokenizers = Tokenizers(config.model_tokenizers())
        self.instances = [Instance(spec, config) for spec in config.instance_specs()]
        self.by_name = {instance.name: instance for instance in self.instances}
        self.static = set(self.by_name)
        self.discovered: dict[str, Instance] = {}
        self.masters = MasterClient(config.master, token=config.token) if config.master \
            else None
        self.pool = ThreadPoolExecutor(4, thread_name_prefix="gcache-router")
        self.session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._masters_failing = False
        for instance in self.instances:
            UP.labels(instance.name).set(1)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v1/chat/completions", self.complete)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _app: web.Application) -> None:
        # A hung engine (its health check may still pass) holds no request past
        # ``upstream_read_s`` of silence: before its first byte the request goes elsewhere.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.upstream_connect_s,
                                        sock_read=self.config.upstream_read_s)
        self.session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
        self._tasks.append(asyncio.create_task(self._check_health()))
        if self.masters is not None:
            self._tasks.append(asyncio.create_task(self._discover()))

    async def _stop(self, _app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        if self.session is not None:
            await self.session.close()
        self.close()

    def close(self) -> None:
        """Stop the event subscribers, the masters' client and the thread pool (idempotent)."""
        for instance in self.instances:
            instance.close()
        if self.masters is not None:
            self.masters.close()
        self.pool.shutdown(wait=False)

    # ---- endpoints ------------------------------------------------------------------------------

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "owned_by": "gcache-router"}
            for name in self.tokenizers.paths]})

    async def health(self, _request: web.Request) -> web.Response:
        up = [instance.name for instance in self.instances if instance.healthy]
        return web.json_response({"instances_up": up}, status=200 if up else 503)

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(REGISTRY),
                            headers={"Content-Type": "text/plain; version=0.0.4"})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError as exc:
            return error_response(400, f"malformed JSON in the request body: {exc}")
        if not isinstance(body, dict):
            return error_response(400, "the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or model not in self.tokenizers:
            return error_response(404, f"The model `{model}` does not exist; this router "
                                       f"serves {sorted(self.tokenizers.paths)}")
        loop = asyncio.get_running_loop()
        try:
            tokens = await loop.run_in_executor(self.pool, self._tokens, model, request.path,
                                                body)
        except InvalidRequest as exc:
            return error_response(400, str(exc))
        known = lookup_tokens(self.tokenizers.get(model), request.path, body, tokens)
        hashes = view_hashes(known, self.config.block_size)
        gcache_hit = await loop.run_in_executor(self.pool, self._gcache_hit, model, known)
        tried: set[str] = set()
        while True:
            candidates = [i for i in self.instances if i.name not in tried and i.serves(model)]
            states = [i.state(hashes) for i in candidates]
            try:
                decision = route(len(tokens), gcache_hit, states, self.policy)
            except InvalidRequest as exc:
                return error_response(400, str(exc))
            except NoInstance:
                down = sorted(i.name for i in self.instances
                              if not i.healthy and i.serves(model))
                return error_response(503, f"no engine instance can take the request (down: "
                                           f"{down}, failed it: {sorted(tried)})")
            instance = self.by_name[decision.instance]
            state = next(s for s in states if s.name == instance.name)
            uncached = len(tokens) - min(len(tokens), max(state.host_hit_tokens, gcache_hit))
            if gcache_hit > state.host_hit_tokens and not tried:   # it will load from GCache
                loop.run_in_executor(self.pool, self.hits.prefetch, model, known, gcache_hit)
            route_header = (f"instance={instance.name}; reason={decision.reason}; "
                            f"bucket={decision.bucket}; gcache_hit_tokens={gcache_hit}; "
                            f"gpu_hit_tokens={state.gpu_hit_tokens}; "
                            f"host_hit_tokens={state.host_hit_tokens}")
            answered = await self._forward(request, raw, instance, uncached, hashes, route_header)
            if answered is not None:
                ROUTED.labels(instance.name, decision.reason).inc()
                GCACHE_HIT.inc(gcache_hit)
                PROMPT.inc(len(tokens))
                return answered
            FAILOVERS.labels(instance.name).inc()
            tried.add(instance.name)

    def _tokens(self, model: str, path: str, body: dict[str, Any]) -> list[int]:
        return prompt_tokens(self.tokenizers.get(model), path, body)

    def _gcache_hit(self, model: str, tokens: list[int]) -> int:
        """GCache's hit, or 0 when it cannot be had: routing goes on without it."""
        try:
            return self.hits.hit_tokens(model, tokens)
        except GCacheError as exc:
            log.warning("router.gcache lookup for %s failed: %s", model, exc)
            return 0

    # ---- forwarding -----------------------------------------------------------------------------

    async def _forward(self, request: web.Request, raw: bytes, instance: Instance, uncached: int,
                       hashes: Sequence[bytes], route_header: str) -> web.StreamResponse | None:
        """The client's response, or None when the engine failed before answering anything (the
        caller routes the request again)."""
        assert self.session is not None
        # identity: the bytes are passed on as they come, without their encoding headers
        headers = {"Content-Type": "application/json", "Accept-Encoding": "identity"}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        instance.queued_prefill_tokens += uncached
        _publish_load(instance)
        queued, decoding = True, False
        try:
            upstream = await self.session.post(instance.spec.url + request.path, data=raw,
                                               headers=headers)
        except UPSTREAM_ERRORS as exc:
            instance.queued_prefill_tokens -= uncached
            _publish_load(instance)
            self._engine_failed(instance, exc, "before answering")
            return None
        instance.routed(hashes)
        try:
            try:
                first = await upstream.content.readany()
            except UPSTREAM_ERRORS as exc:
                self._engine_failed(instance, exc, "before answering")
                return None
            instance.queued_prefill_tokens -= uncached
            instance.running_decodes += 1
            _publish_load(instance)
            queued, decoding = False, True
            out_headers = {"x-gcache-route": route_header}
            content_type = upstream.headers.get("Content-Type")
            if content_type:
                out_headers["Content-Type"] = content_type
            if not content_type or not content_type.startswith("text/event-stream"):
                try:
                    rest = await upstream.read()
                except UPSTREAM_ERRORS as exc:
                    self._engine_failed(instance, exc, "in the middle of an answer")
                    return error_response(502, f"engine {instance.name} failed while "
                                               f"answering: {exc}")
                instance.answered()
                return web.Response(body=first + rest, status=upstream.status,
                                    headers=out_headers)
            response = web.StreamResponse(status=upstream.status, headers=out_headers)
            await response.prepare(request)
            chunk = first
            while chunk:
                # A failed write is the client's (gone): it propagates, and the engine's
                # request is aborted below by closing its connection. A failed read is the
                # engine's: the client is told in the stream.
                await response.write(chunk)
                try:
                    chunk = await upstream.content.readany()
                except UPSTREAM_ERRORS as exc:
                    self._engine_failed(instance, exc, "in the middle of a stream")
                    event = error_body(502, f"engine {instance.name} failed while streaming: "
                                            f"{exc}")
                    await response.write(f"data: {json.dumps(event)}\n\n".encode())
                    break
            else:
                instance.answered()
            await response.write_eof()
            return response
        finally:
            if decoding:
                instance.running_decodes -= 1
            if queued:
                instance.queued_prefill_tokens -= uncached
            _publish_load(instance)
            if upstream.content.at_eof():
                upstream.release()
            else:
                upstream.close()

    def _engine_failed(self, instance: Instance, exc: BaseException, when: str) -> None:
        """Down; and held down when it went silent (a read timeout, not a refused or slow
        connection), before its answer or in the middle of it: its health checks would bring
        it back at once, and every request sent there would wait out the whole read timeout
        again. Only a whole answer ends a run of hangs (``Instance.answered``), so an engine
        that keeps stalling mid-stream is held longer each time."""
        if isinstance(exc, aiohttp.SocketTimeoutError):
            instance.hold_after_hang(self.config.hang_hold_s, f"silent for "
                                     f"{self.config.upstream_read_s:g}s {when}")
        else:
            instance.mark(False, f"failed {when}: {type(exc).__name__}: {exc}")
        UP.labels(instance.name).set(0)

    # ---- engines announced to the masters ---------------------------------------------------

    async def _discover(self) -> None:
        """Every health interval, the engines the masters know join the pools (for the
        models they announced) and those that stopped announcing leave."""
        assert self.masters is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                engines = await loop.run_in_executor(self.pool, self.masters.engines)
            except GCacheError as exc:
                if not self._masters_failing:
                    log.warning("router.masters cannot list engines: %s", exc)
                self._masters_failing = True
            else:
                self._masters_failing = False
                for gone in self._apply_announced(engines):
                    await loop.run_in_executor(self.pool, gone.close)
            await asyncio.sleep(self.config.health_interval_s)

    def _apply_announced(self, engines: Sequence[pb.Engine]) -> list[Instance]:
        """Update the discovered instances to ``engines``; returns those that left."""
        wanted: dict[str, tuple[InstanceSpec, set[str]]] = {}
        for engine in engines:
            if engine.model not in self.tokenizers or engine.bucket >= len(self.policy.buckets):
                continue                   # another router's model, or a bucket we lack
            spec = announced(engine.url, engine.bucket, engine.events)
            if spec.name in self.static:
                continue                   # configured here: the configuration wins
            wanted.setdefault(spec.name, (spec, set()))[1].add(engine.model)
        gone = []
        for name, instance in list(self.discovered.items()):
            if name not in wanted or wanted[name][0] != instance.spec:
                log.info("router.instance %s left (no longer announced as before)", name)
                del self.discovered[name], self.by_name[name]
                self.instances.remove(instance)
                UP.labels(name).set(0)
                gone.append(instance)
        for name, (spec, models) in wanted.items():
            if name in self.discovered:
                instance = self.discovered[name]
            else:
                instance = self.discovered[name] = self.by_name[name] = \
                    Instance(spec, self.config)
                self.instances.append(instance)
                UP.labels(name).set(1)
                log.info("router.instance %s joined from the masters (bucket %d, events %s)",
                         name, spec.bucket, spec.events or "none")
            instance.models = models
        return gone

    # ---- health ---------------------------------------------------------------------------------

    async def _check_health(self) -> None:
        """Every instance at once, every health interval (one slow engine delays no other)."""
        while True:
            await asyncio.gather(*(self._check(i) for i in list(self.instances)))
            await asyncio.sleep(self.config.health_interval_s)

    async def _check(self, instance: Instance) -> None:
        """A refused or failed check marks the instance down at once (a dead engine); a slow
        one only after ``SLOW_CHECKS_DOWN`` in a row, since one slow answer from an engine
        that is busy prefilling is load, and a down-and-back costs its whole view."""
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=self.config.health_timeout_s)
        try:
            async with self.session.get(instance.spec.url + "/health",
                                        timeout=timeout) as answer:
                ok, why = answer.status == 200, f"health answered {answer.status}"
        except TimeoutError:
            instance.slow_checks += 1
            if instance.slow_checks < SLOW_CHECKS_DOWN:
                return
            ok, why = False, (f"{instance.slow_checks} health checks in a row took over "
                              f"{self.config.health_timeout_s}s")
        except UPSTREAM_ERRORS as exc:
            ok, why = False, f"health check failed: {type(exc).__name__} {exc}"
        else:
            instance.slow_checks = 0
        instance.mark(ok, why)
        UP.labels(instance.name).set(1 if instance.healthy else 0)
