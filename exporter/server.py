"""The sidecar's HTTP endpoint: a small threaded server over a table of routes.

Each route is a function returning ``(status, content type, body)``; the sidecar builds the table
(/metrics, /healthz, /readyz, / for the status page), so this module knows nothing about
metrics. A route that raises answers 500 and is logged; the server never goes down with it.

Under load and abuse: the listen backlog is ``BACKLOG`` (a burst of scrapes and probes queues
instead of being refused or waiting for SYN retries), a connection that sends nothing for
``IDLE_TIMEOUT_S`` (a half-open or slow client, an idle keep-alive) is closed, and a client that
hangs up mid-answer is logged at debug level — never a traceback per client.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("nvrx_slo.server")

Response = tuple[int, str, bytes]
Route = Callable[[], Response]

TEXT = "text/plain; charset=utf-8"
BACKLOG = 1024  # the listen queue (socketserver's default is 5); the kernel caps it at somaxconn
IDLE_TIMEOUT_S = 30.0  # longer than any scrape interval's keep-alive gap needs, short enough to free threads


def _handler(routes: Mapping[str, Route], idle_timeout_s: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "nvrx-slo"
        protocol_version = "HTTP/1.1"
        # headers and body go out in two writes: without TCP_NODELAY the body waits for the
        # client's delayed ACK of the headers (~40 ms on Linux loopback)
        disable_nagle_algorithm = True
        timeout = idle_timeout_s  # socket timeout: an idle or slow client is dropped, its thread freed

        def do_GET(self) -> None:
            self._answer(send_body=True)

        def do_HEAD(self) -> None:
            self._answer(send_body=False)

        def _answer(self, send_body: bool) -> None:
            route = routes.get(urlsplit(self.path).path)
            if route is None:
                status, ctype, body = 404, TEXT, f"not found; try {', '.join(routes)}\n".encode()
            else:
                try:
                    status, ctype, body = route()
                except Exception:
                    log.exception("GET %s failed", self.path)
                    status, ctype, body = 500, TEXT, b"internal error (see the sidecar's log)\n"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body:
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


class _Server(ThreadingHTTPServer):
    request_queue_size = BACKLOG
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError)):  # the client went away or stalled
            log.debug("client %s: %s", client_address, exc)
            return
        log.exception("error answering %s", client_address)


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class Server:
    """Serves ``routes`` on ``host:port`` (port 0 picks a free one; see ``port``) in a daemon thread."""

    def __init__(self, host: str, port: int, routes: Mapping[str, Route], *,
                 idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        server = _IPv6Server if ":" in host else _Server  # "::", "::1": an IPv6 address
        self._httpd = server((host, port), _handler(dict(routes), idle_timeout_s))
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
