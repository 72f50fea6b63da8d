"""The sidecar's HTTP endpoint: one event loop over a table of routes.

Each route is a function returning ``(status, content type, body)``; the sidecar builds the table
(/metrics, /healthz, /readyz, / for the status page), so this module knows nothing about
metrics. A route that raises answers 500 and is logged; the server never goes down with it.

Why an event loop (stdlib ``asyncio``) and not a thread per connection (``http.server``): a
kubelet probe must be answered within its 1 s timeout however busy the sidecar is. With a thread
per connection, a storm of scrapes queued a probe behind every connection accepted before it,
each thread start waiting for the interpreter lock that the renders held: /healthz took up to
1.9 s under 1,000 concurrent /metrics, and 1,500 idle connections held 1,500 threads. Here
accepting and reading a request costs no thread: *quick* routes (the probes: they must only read
a flag) are answered in the loop at once, and the others run on one worker thread, each call
shared by every request that arrived before it began (a burst of 1,000 scrapes renders a few
times, not 1,000, and each scrape still gets numbers taken after it arrived). aiohttp (already
installed with kubernetes) would serve as well; the server needs GET and HEAD only, and the
stdlib parses the headers (``http.client.parse_headers``), so a dependency more in every
sidecar bought nothing here.

Under load and abuse: the listen backlog is ``BACKLOG``; a connection that sends no complete
request head within ``IDLE_TIMEOUT_S`` (an idle keep-alive, a half-open or slow client) or does
not read its answer within it is closed; a request head over ``MAX_HEAD_BYTES`` is refused, 414
if its request line alone is, else 431, as is a head of more than 100 header lines (the
standard library's server answered these so);
a client that hangs up mid-answer is logged at debug level — never a traceback per client.
Measured in ``bench/bench_probes.py`` (docs/robustness.md, docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import email.message
import functools
import http.client
import io
import logging
import socket
import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("nvrx_slo.server")

Response = tuple[int, str, bytes]
Route = Callable[[], Response]

TEXT = "text/plain; charset=utf-8"
BACKLOG = 4096  # the listen queue: a storm of scrapes and the probes among them; the kernel caps it at somaxconn
IDLE_TIMEOUT_S = 30.0  # longer than any scrape interval's keep-alive gap needs, short enough to free connections
MAX_HEAD_BYTES = 16 << 10  # a request line and headers; Prometheus and kubelets send a few hundred bytes
MAX_HEADERS = 100  # header lines, the blank one included: as many as ``http.client`` parses
_END = b"\r\n\r\n"


class _Shared:
    """A route that runs on the worker thread, each run shared by every request that arrived
    before it began (so no answer holds numbers older than its request)."""

    def __init__(self, route: Route, executor: ThreadPoolExecutor) -> None:
        self._route = route
        self._executor = executor
        self._current: asyncio.Future[Response] | None = None  # the run under way
        self._next: asyncio.Future[Response] | None = None  # the run the requests since it began wait for

    def answer(self) -> asyncio.Future[Response]:
        """The run this request gets: the next one to begin (one future for all who wait on it)."""
        if self._next is None:
            self._next = asyncio.ensure_future(self._after_current())
        return self._next

    async def _after_current(self) -> Response:
        if self._current is not None:
            await asyncio.wait([self._current])  # it began before some of us arrived: not ours
        self._next = None  # who arrives from now on waits for the run after this one
        run = self._current = asyncio.get_running_loop().run_in_executor(self._executor, _answer, self._route)
        try:
            return await run
        finally:
            if self._current is run:
                self._current = None


def _answer(route: Route) -> Response:
    try:
        return route()
    except Exception:
        log.exception("route %s failed", getattr(route, "__name__", route))
        return 500, TEXT, b"internal error (see the sidecar's log)\n"


class _TooManyHeaders(ValueError):
    """More header lines than ``MAX_HEADERS``."""


class _Request:
    """The parts of a request head the server uses; ``ValueError`` if it is not HTTP/1.x."""

    def __init__(self, head: bytes) -> None:
        line, _, rest = head.partition(b"\r\n")
        try:
            method, target, version = line.decode("ascii").split(" ")
        except (UnicodeDecodeError, ValueError):
            raise ValueError("bad request line") from None
        if version not in ("HTTP/1.0", "HTTP/1.1"):
            raise ValueError(f"unsupported version {version[:20]!r}")
        if rest.count(b"\r\n") > MAX_HEADERS:  # its header lines and the blank one, counted as http.client does
            raise _TooManyHeaders(f"more than {MAX_HEADERS} header lines")
        try:
            headers: email.message.Message = http.client.parse_headers(io.BytesIO(rest))
        except http.client.HTTPException:
            raise ValueError("bad headers") from None
        self.method = method
        self.path = urlsplit(target).path
        connection = (headers.get("Connection") or "").lower()
        self.keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection


def _head(status: int, ctype: str, length: int, keep_alive: bool, extra: str = "") -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return (f"HTTP/1.1 {status} {phrase}\r\nServer: nvrx-slo\r\nContent-Type: {ctype}\r\n"
            f"Content-Length: {length}\r\n{extra}Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
            ).encode("latin-1")


class _Connection(asyncio.Protocol):
    """One client: its requests in order, each answered before the next is read (no task per
    connection: a quick route is answered from ``data_received`` itself, the others when their
    shared run is done). Closed after ``idle_timeout_s`` without a complete request, or with an
    answer it does not read."""

    def __init__(self, server: Server) -> None:
        self._server = server
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        self._waiting = False  # a request's answer is being rendered: later bytes wait
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._server._connections.add(self)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server._connections.discard(self)
        if self._timer is not None:
            self._timer.cancel()
        if exc is not None:
            log.debug("client %s: %r", self._peer(), exc)  # went away mid-answer

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._waiting:
            self._serve()

    def _serve(self) -> None:
        """Answer every complete request buffered, in order, until one must wait for a render."""
        while self._transport is not None and not self._transport.is_closing():
            end = self._buffer.find(_END, 0, MAX_HEAD_BYTES)
            if end < 0:
                if len(self._buffer) >= MAX_HEAD_BYTES:
                    line_ends = self._buffer.find(b"\r\n", 0, MAX_HEAD_BYTES) >= 0
                    self._finish(_head(431 if line_ends else 414, TEXT, 0, False), False)
                return
            head, self._buffer = self._buffer[:end + len(_END)], self._buffer[end + len(_END):]
            try:
                request = _Request(head)
            except _TooManyHeaders:
                self._finish(_head(431, TEXT, 0, False), False)
                return
            except ValueError as exc:
                body = f"bad request: {exc}\n".encode()
                self._finish(_head(400, TEXT, len(body), False) + body, False)
                return
            server = self._server
            if request.method not in ("GET", "HEAD"):
                self._finish(_head(405, TEXT, 0, request.keep_alive, "Allow: GET, HEAD\r\n"), request.keep_alive)
                continue
            route = server._routes.get(request.path)
            if route is None:
                body = f"not found; try {', '.join(server._routes)}\n".encode()
                self._reply(request, (404, TEXT, body))
            elif request.path in server._quick:
                self._reply(request, _answer(route))
            else:
                self._waiting = True
                self._transport.pause_reading()  # what it sends meanwhile waits in the kernel, not here
                if self._timer is not None:
                    self._timer.cancel()  # the render's time is not the client's
                server._shared[request.path].answer().add_done_callback(functools.partial(self._rendered, request))
                return

    def _rendered(self, request: _Request, done: asyncio.Future[Response]) -> None:
        self._waiting = False
        if done.cancelled() or self._transport is None or self._transport.is_closing():
            return
        self._reply(request, done.result())
        if not self._transport.is_closing():
            self._transport.resume_reading()
            self._serve()

    def pause_writing(self) -> None:  # answers pile up unread: read no more requests meanwhile
        assert self._transport is not None
        self._transport.pause_reading()

    def resume_writing(self) -> None:
        assert self._transport is not None
        if not self._waiting:
            self._transport.resume_reading()

    def _reply(self, request: _Request, response: Response) -> None:
        status, ctype, body = response
        head = _head(status, ctype, len(body), request.keep_alive)
        self._finish(head + body if request.method == "GET" else head, request.keep_alive)

    def _finish(self, data: bytes, keep_alive: bool) -> None:
        assert self._transport is not None
        self._transport.write(data)
        self._arm()  # the answer must be read within the timeout too
        if not keep_alive:
            self._transport.close()  # once what is buffered is sent

    def _arm(self) -> None:
        """(Re)start the idle clock: a complete request, and every answer read, within the timeout."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_later(self._server._idle_timeout_s, self._idle)

    def _idle(self) -> None:
        if self._transport is not None and not self._waiting:
            log.debug("client %s: idle for %g s, closed", self._peer(), self._server._idle_timeout_s)
            self._transport.abort()  # an answer still unread is dropped with it

    def _peer(self) -> Any:
        return None if self._transport is None else self._transport.get_extra_info("peername")


class Server:
    """Serves ``routes`` on ``host:port`` (port 0 picks a free one; see ``port``) from a daemon
    thread's event loop. The ``quick`` routes are answered in the loop and must not block; the
    others run on one worker thread (see the module docstring)."""

    def __init__(self, host: str, port: int, routes: Mapping[str, Route], *, quick: Collection[str] = (),
                 idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET  # "::", "::1": an IPv6 address
        self._sock = socket.create_server((host, port), family=family, backlog=BACKLOG)  # OSError: the flags' fault
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="http-render")
        self._routes = dict(routes)
        self._quick = frozenset(quick)
        self._shared = {path: _Shared(route, self._executor) for path, route in self._routes.items()
                        if path not in self._quick}
        self._idle_timeout_s = idle_timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="http", daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._connections: set[_Connection] = set()

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=30)

    def stop(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=30)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        self._sock.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _listen(self) -> None:
        # create_server listens again, with its own backlog (100) unless told: a full queue drops a
        # probe's SYN, which the client sends again only 1 s later
        self._server = await self._loop.create_server(lambda: _Connection(self), sock=self._sock, backlog=BACKLOG)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self._connections):
            if connection._transport is not None:
                connection._transport.abort()
