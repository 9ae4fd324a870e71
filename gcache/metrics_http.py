"""The daemons' ``/metrics`` endpoint: HTTP from a daemon thread, behind the cluster token.

Shared by ``gcache-server`` and ``gcache-master``; it knows nothing of Prometheus beyond the
``render`` callback it is given (which returns the exposition text), so it stays at the top of
the layering. With a cluster token every request must carry ``Authorization: Bearer <token>``
(Prometheus' ``authorization`` scrape setting); without one the daemons' configs keep the
address on loopback, like every other entry point. A wrong or missing token is a 401 and a log
line that names the peer, never the token.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gcache.errors import ConfigError

log = logging.getLogger(__name__)


def serve_metrics_http(address: str, render: Callable[[], bytes], *, token: str | None,
                       content_type: str) -> ThreadingHTTPServer:
    """Serve ``render()`` at ``/metrics`` on ``address`` (HOST:PORT). Raises ConfigError when
    the address cannot be bound."""
    expected = None if token is None else f"Bearer {token}".encode()

    class Handler(BaseHTTPRequestHandler):
        timeout = 10.0                  # seconds a scraper may take: an idle one frees its thread

        def do_GET(self) -> None:
            if expected is not None and not hmac.compare_digest(
                    self.headers.get("Authorization", "").encode(), expected):
                log.warning("metrics.auth_failed peer=%s", self.client_address[0])
                self._answer(401, b"cluster token required\n", "text/plain",
                             {"WWW-Authenticate": "Bearer"})
                return
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self._answer(404, b"not found\n", "text/plain")
                return
            self._answer(200, render(), content_type)

        def _answer(self, status: int, body: bytes, kind: str,
                    extra: dict[str, str] | None = None) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return                   # one line per scrape would drown the daemon's own log

    host, _, port = address.rpartition(":")
    try:
        server = ThreadingHTTPServer((host.strip("[]"), int(port)), Handler)
    except OSError as exc:
        raise ConfigError("metrics_listen", address, f"cannot listen: {exc}") from exc
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="gcache-metrics", daemon=True).start()
    return server
