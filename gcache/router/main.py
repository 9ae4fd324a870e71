"""``gcache-router``: the routing proxy's daemon (config, GCache client, HTTP server, signals)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from gcache.config import ClientConfig
from gcache.config_loader import config_from_args, redacted
from gcache.errors import GCacheError
from gcache.router.config import RouterConfig
from gcache.router.gcache_hits import GCacheHits
from gcache.sdk import Client

log = logging.getLogger("gcache.router")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gcache-router", description="KV-cache-affinity router in front of vLLM engines "
        "(OpenAI-compatible: /v1/completions, /v1/chat/completions, /v1/models, /health, "
        "/metrics)")
    parser.add_argument("--listen", help="HOST:PORT of the API (default 127.0.0.1:8100)")
    parser.add_argument("--instance", dest="instances", action="append",
                        help="an engine: URL[;bucket=N][;events=ZMQ_ENDPOINT] (repeat per engine)")
    parser.add_argument("--model", dest="models", action="append",
                        help="a served model: NAME=TOKENIZER (folder or hub name; repeat)")
    parser.add_argument("--block-size", dest="block_size", help="the engines' KV block size")
    parser.add_argument("--servers", help="GCache data servers HOST:PORT, comma separated")
    parser.add_argument("--master", help="or GCache masters HOST:PORT, comma separated")
    parser.add_argument("--token", help="GCache cluster token (prefer GCACHE_TOKEN)")
    parser.add_argument("--buckets", help="length buckets' upper bounds in tokens, comma "
                        "separated (default 65536,262144,1048576)")
    parser.add_argument("--health-interval", dest="health_interval_s", help="seconds")
    parser.add_argument("--health-timeout", dest="health_timeout_s",
                        help="seconds one health check may take (two slow ones in a row: down)")
    parser.add_argument("--upstream-read-timeout", dest="upstream_read_s",
                        help="seconds an engine may stay silent (before the first byte of a "
                        "response, or between two chunks) before it counts as failed (600)")
    parser.add_argument("--hang-hold", dest="hang_hold_s",
                        help="seconds an engine that went silent past --upstream-read-timeout "
                        "before its first byte stays out of rotation, though its health checks "
                        "pass (30; doubled for each such hang in a row, up to 32x)")
    parser.add_argument("--config", help="TOML file with a [router] section")
    parser.add_argument("--log-level", default="INFO")
    return parser


def gcache_client(config: RouterConfig) -> Client | None:
    if not config.servers and not config.master:
        return None
    return Client(config=ClientConfig(servers=config.servers, master=config.master,
                                      token=config.token, timeout_s=config.gcache_timeout_s))


async def serve(config: RouterConfig) -> None:
    from aiohttp import web

    from gcache.router.proxy import Router
    hits = GCacheHits(gcache_client(config))
    router = Router(config, hits)
    try:
        await asyncio.get_running_loop().run_in_executor(router.pool, router.tokenizers.load_all)
    except GCacheError:
        router.close()
        hits.close()
        raise
    runner = web.AppRunner(router.app(), access_log=None)
    await runner.setup()
    host, _, port = config.listen.rpartition(":")
    try:
        await web.TCPSite(runner, host.strip("[]"), int(port)).start()
    except OSError as exc:
        await runner.cleanup()
        router.close()
        hits.close()
        raise GCacheError(f"cannot listen on {config.listen}: {exc.strerror}") from exc
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    sys.stderr.write(f"gcache-router ready listen={config.listen} "
                     f"instances={len(config.instances)}\n")
    sys.stderr.flush()
    await stop.wait()
    log.info("router.stopping listen=%s", config.listen)
    await runner.cleanup()
    hits.close()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = config_from_args(RouterConfig, "router", args)
        log.info("router.config %s", " ".join(f"{k}={v}" for k, v in redacted(config).items()))
        asyncio.run(serve(config))
    except GCacheError as exc:
        sys.stderr.write(f"gcache-router: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
