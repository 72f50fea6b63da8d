"""Helpers for tests that run real servers (Prometheus, Alertmanager, sidecars) on loopback, and a stub
server for the HTTP peers that do not run here."""

from __future__ import annotations

import selectors
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check: Callable[[], Any], what: str, timeout: float) -> None:
    """Poll ``check`` until it is truthy; a refused or reset connection counts as not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f}s")


def start_prometheus(prometheus: str, config: Path, directory: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A Prometheus on loopback with ``config``, its data and log in ``directory``: (process, URL).
    ``prometheus``: its binary (``needs.tool``). Stop it with ``stop``."""
    port = free_port()
    proc = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={directory / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=open(directory / "prometheus.log", "wb"))
    return proc, f"http://127.0.0.1:{port}"


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM a server this test started, then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def burst(port: int, n: int, path: str = "/healthz", timeout: float = 60.0) -> list[float]:
    """``n`` connections at once, each sending one GET: the seconds each took to its full answer."""
    socks, started, done = [], {}, {}
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    pending = {s.fileno(): s for s in socks}
    sent: set[int] = set()
    buffers: dict[int, bytes] = {fd: b"" for fd in pending}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for fd, s in pending.items():
            sel.register(s, selectors.EVENT_WRITE)
            started[fd] = time.monotonic()
        while pending and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=1.0):
                fd, s = key.fd, key.fileobj
                if fd not in sent:
                    s.send(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                    sent.add(fd)
                    sel.modify(s, selectors.EVENT_READ)
                    continue
                chunk = s.recv(65536)
                buffers[fd] += chunk
                if not chunk:
                    done[fd] = time.monotonic() - started[fd]
                    sel.unregister(s)
                    del pending[fd]
    for s in socks:
        s.close()
    assert not pending, f"{len(pending)} of {n} connections unanswered"
    assert all(b.startswith(b"HTTP/1.1 200") for b in buffers.values())
    return sorted(done.values())


# (method, path, headers, body) -> (status, content type, body)
Answer = Callable[[str, str, Message, bytes], tuple[int, str, bytes]]


class HttpStub:
    """A loopback HTTP server that answers every request with ``answer``: the seam for an HTTP peer that
    does not run here (an OTLP collector, the Kubernetes API server, Alertmanager's webhook receiver),
    as httpx's ``MockTransport`` is a transport driven by a function. Serves from construction."""

    def __init__(self, answer: Answer) -> None:
        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, content_type, reply = answer(self.command, self.path, self.headers, body)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
