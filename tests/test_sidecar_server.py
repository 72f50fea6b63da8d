"""The route server: a failing route answers 500 and the server stays up; HEAD, 404, loopback only."""

from __future__ import annotations

import http.client

from nvrx_slo.exporter.server import TEXT, Server


def test_routes_errors_and_head(caplog):
    def boom():
        raise RuntimeError("bug in a view")

    server = Server("127.0.0.1", 0, {"/ok": lambda: (200, TEXT, b"fine\n"), "/boom": boom})
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)  # one kept-alive connection
        answers = []
        for method, path in (("GET", "/boom"), ("GET", "/ok?x=1"), ("HEAD", "/ok"), ("GET", "/nope")):
            conn.request(method, path)
            resp = conn.getresponse()
            answers.append((resp.status, resp.read(), resp.getheader("Content-Length")))
        conn.close()
    finally:
        server.stop()
    assert answers[0][0] == 500 and b"internal error" in answers[0][1]
    assert answers[1] == (200, b"fine\n", "5")
    assert answers[2] == (200, b"", "5")  # HEAD: the headers only
    assert answers[3][0] == 404 and b"/ok" in answers[3][1]
    assert "bug in a view" in caplog.text
