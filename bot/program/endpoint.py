"""The HTTP endpoint of a running bot: `/metrics` for Prometheus, `/healthz` for healthchecks (METRICS_PORT).

It runs on threads of its own (the standard library's WSGI server, one thread per request), not on the event
loop: a health check must answer, and say so, when the loop is the thing that is stuck. `/healthz` answers 200 with
`{"status": "ok", …}` when every check passes and 503 with the failing ones otherwise (bot/program/health.py).
"""

from __future__ import annotations

import json
import logging
import threading
from socketserver import ThreadingMixIn
from typing import Any, Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from bot.program.config import ConfigError
from bot.program.health import HealthReport

log = logging.getLogger(__name__)

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never holds up the process's exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
        """Scrapes every few seconds would drown the log."""


class Endpoint:
    """/metrics and /healthz on `host`:`port`, until `stop()`."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry, health: Callable[[], HealthReport]):
        self.metrics_app = make_wsgi_app(registry)
        self.health = health
        try:
            self.server = make_server(host, port, self.app, server_class=_Server, handler_class=_QuietHandler)
        except OSError as error:
            raise ConfigError(f"METRICS_PORT: cannot listen on {host}:{port}: {error.strerror or error} (another "
                              f"process there? set METRICS_PORT=0 to turn the endpoint off)") from None
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.2},
                                       name="metrics-endpoint", daemon=True)

    @property
    def port(self) -> int:
        """The port it listens on (the one chosen when METRICS_PORT asked for any)."""
        return self.server.server_address[1]

    def start(self) -> "Endpoint":
        """Serve in the background."""
        self.thread.start()
        log.info("metrics at http://%s:%d/metrics, health at /healthz", self.server.server_address[0], self.port)
        return self

    def stop(self) -> None:
        """Stop serving and let the port go."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """The WSGI application: /metrics, /healthz, and 404 for the rest."""
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return self.metrics_app(environ, start_response)
        if path == "/healthz":
            return self.healthz(start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: /metrics or /healthz\n"]

    def healthz(self, start_response: StartResponse) -> Iterable[bytes]:
        report = self.health()
        body = json.dumps(report.as_json(), ensure_ascii=False, indent=1).encode() + b"\n"
        status = "200 OK" if report.ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                                ("Cache-Control", "no-store")])
        return [body]
