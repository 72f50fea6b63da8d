"""A tiny OTLP/HTTP metrics receiver on loopback: decodes each export with opentelemetry-proto."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)


class Receiver:
    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportMetricsServiceRequest.FromString(body)
                with receiver.arrived:
                    receiver.requests.append(request)
                    receiver.arrived.notify_all()
                reply = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/metrics" else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def wait(self, n: int, timeout: float = 20.0) -> list[ExportMetricsServiceRequest]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.requests) >= n, timeout)
            return list(self.requests)


def metrics_by_name(request: ExportMetricsServiceRequest) -> dict:
    return {m.name: m for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def resource_attributes(request: ExportMetricsServiceRequest) -> dict[str, object]:
    attrs = request.resource_metrics[0].resource.attributes
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in attrs}


def point_attributes(point) -> dict[str, str]:
    return {a.key: a.value.string_value for a in point.attributes}
