"""The route server: a failing route answers 500 and the server stays up; HEAD, 404, loopback only;
probes answered while renders are busy; idle and slow connections closed, holding no thread.

Real sockets on loopback against the real server; the routes are small functions (the seam), so
that a route can be made slow or blocked on purpose. How fast probes are under a storm of scrapes
of a real sidecar is measured in ``bench/bench_probes.py``, not here."""

from __future__ import annotations

import http.client
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from nvrx_slo.exporter.server import TEXT, Route, Server

OK: Route = lambda: (200, TEXT, b"ok\n")  # noqa: E731


@contextmanager
def serving(routes: dict[str, Route], **kw: object) -> Iterator[Server]:
    server = Server("127.0.0.1", 0, routes, **kw)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def get(port: int, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def raw(port: int, request: bytes) -> bytes:
    """Send ``request`` as is; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_routes_errors_and_head(caplog):
    def boom():
        raise RuntimeError("bug in a view")

    with serving({"/ok": lambda: (200, TEXT, b"fine\n"), "/boom": boom}) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)  # one kept-alive connection
        answers = []
        for method, path in (("GET", "/boom"), ("GET", "/ok?x=1"), ("HEAD", "/ok"), ("GET", "/nope")):
            conn.request(method, path)
            resp = conn.getresponse()
            answers.append((resp.status, resp.read(), resp.getheader("Content-Length")))
        conn.close()
    assert answers[0][0] == 500 and b"internal error" in answers[0][1]
    assert answers[1] == (200, b"fine\n", "5")
    assert answers[2] == (200, b"", "5")  # HEAD: the headers only
    assert answers[3][0] == 404 and b"/ok" in answers[3][1]
    assert "bug in a view" in caplog.text


def test_bad_requests_are_answered_and_closed():
    with serving({"/ok": OK}, quick=("/ok",)) as server:
        assert raw(server.port, b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        assert raw(server.port, b"GET /ok SPDY/9\r\n\r\n").startswith(b"HTTP/1.1 400 ")
        assert raw(server.port, b"GET /ok HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n").startswith(b"HTTP/1.1 431 ")
        # as the standard library's server answered: a request line too long for the head is 414,
        # 100 header lines or more (the blank one counted, as http.client counts) 431
        assert raw(server.port, b"GET /ok?" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 414 ")
        headers = b"".join(b"X-%d: y\r\n" % i for i in range(200))
        assert raw(server.port, b"GET /ok HTTP/1.1\r\n" + headers + b"\r\n").startswith(b"HTTP/1.1 431 ")
        for n, status in ((99, b"431"), (98, b"200")):  # n headers and Connection
            head = b"GET /ok HTTP/1.1\r\n" + headers[:headers.index(b"X-%d:" % n)] + b"Connection: close\r\n\r\n"
            assert raw(server.port, head).startswith(b"HTTP/1.1 " + status), n
        posted = raw(server.port, b"POST /ok HTTP/1.1\r\nConnection: close\r\n\r\n")
        assert posted.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, HEAD" in posted
        old = raw(server.port, b"GET /ok HTTP/1.0\r\n\r\n")  # HTTP/1.0: closed after the answer
        assert old.startswith(b"HTTP/1.1 200 ") and old.endswith(b"ok\n")
        assert get(server.port, "/ok") == (200, b"ok\n")  # and still serving


def test_idle_and_slow_connections_hold_no_thread_and_are_closed_after_the_timeout():
    """One thread per connection let 1,500 idle connections hold 1,500 threads (a slow client
    could hold every one): now a connection costs no thread, and is closed when it sends no
    complete request within the timeout — nothing at all, or half a request line."""
    with serving({"/ok": OK}, quick=("/ok",), idle_timeout_s=1.0) as server:
        before = threading.active_count()
        idle = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(200)]
        for s in idle[::2]:
            s.sendall(b"GET /o")  # slow: half a request line, then nothing
        assert get(server.port, "/ok") == (200, b"ok\n")  # answered meanwhile
        assert threading.active_count() <= before + 1  # the worker thread, at most
        began = time.monotonic()
        for s in idle:
            assert s.recv(1) == b""  # closed by the server, not by our 30 s timeout
            s.close()
        assert time.monotonic() - began < 20


def test_a_client_that_does_not_read_its_answer_is_dropped_after_the_timeout():
    """A scrape left unread held its thread (and its answer) for as long as the client stayed."""
    big = b"x" * (4 << 20)
    with serving({"/big": lambda: (200, TEXT, big)}, idle_timeout_s=1.0) as server:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
            s.settimeout(30)
            s.connect(("127.0.0.1", server.port))
            s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(3.0)  # reads nothing for three timeouts
            got = 0
            try:
                while chunk := s.recv(1 << 20):
                    got += len(chunk)
            except ConnectionResetError:
                pass
        assert got < len(big)  # dropped, not sent in full
        assert get(server.port, "/big", timeout=60)[0] == 200  # a client that reads gets it


def test_a_probe_is_answered_while_every_render_is_blocked():
    """A quick route is answered in the event loop: a render that never returns (or a thousand
    queued ones) cannot hold it back."""
    release = threading.Event()

    def stuck() -> tuple[int, str, bytes]:
        release.wait(60)
        return 200, TEXT, b"metrics\n"

    with serving({"/metrics": stuck, "/healthz": OK}, quick=("/healthz",)) as server, \
            ThreadPoolExecutor(max_workers=20) as pool:
        scrapes = [pool.submit(get, server.port, "/metrics") for _ in range(20)]
        time.sleep(0.5)  # every scrape is waiting on the blocked render
        assert not any(f.done() for f in scrapes)
        assert get(server.port, "/healthz", timeout=10) == (200, b"ok\n")
        release.set()
        assert [f.result(timeout=60) for f in scrapes] == [(200, b"metrics\n")] * 20


def test_concurrent_scrapes_share_a_render_begun_after_they_arrived():
    """A thread per request rendered /metrics once per scrape: 1,000 concurrent scrapes, 1,000
    renders one after another. Scrapes that arrive while one renders wait for the next, which
    all of them share: never numbers taken before a scrape arrived."""
    calls: list[float] = []

    def render() -> tuple[int, str, bytes]:
        calls.append(time.monotonic())
        time.sleep(0.3)
        return 200, TEXT, f"{len(calls)}\n".encode()

    def scrape(port: int) -> tuple[float, int, bytes]:
        sent = time.monotonic()
        return (sent, *get(port, "/metrics"))

    with serving({"/metrics": render}) as server, ThreadPoolExecutor(max_workers=40) as pool:
        answers = list(pool.map(lambda _: scrape(server.port), range(40)))
    assert all(status == 200 for _, status, _ in answers)
    assert len(calls) <= 3, len(calls)  # one under way when some arrived, one for those, perhaps one more
    assert all(calls[int(body) - 1] >= sent for sent, _, body in answers)  # the render began after the request


def test_a_burst_of_connections_queues_while_the_loop_is_busy():
    """asyncio listened again with a backlog of 100: while the loop was busy, the 101st waiting
    connection's SYN was dropped and its client tried again only 1 s later (a probe's timeout)."""
    def busy() -> tuple[int, str, bytes]:
        time.sleep(2.0)  # a quick route that is not: holds the loop, as a burst of accepts would
        return 200, TEXT, b"done\n"

    with serving({"/busy": busy}, quick=("/busy",)) as server, ThreadPoolExecutor(max_workers=1) as pool:
        blocked = pool.submit(get, server.port, "/busy")
        time.sleep(0.3)
        socks = [socket.socket() for _ in range(500)]
        try:
            for s in socks:
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", server.port))
            deadline, connected = time.monotonic() + 0.9, set()
            with selectors.DefaultSelector() as sel:
                for s in socks:
                    sel.register(s, selectors.EVENT_WRITE)
                while len(connected) < len(socks) and (left := deadline - time.monotonic()) > 0:
                    for key, _ in sel.select(timeout=left):
                        if key.fileobj.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                            connected.add(key.fd)
                        sel.unregister(key.fileobj)
            assert len(connected) == len(socks)  # queued by the kernel, not dropped
        finally:
            for s in socks:
                s.close()
        assert blocked.result(timeout=30) == (200, b"done\n")
