"""A tiny OTLP/HTTP metrics receiver on loopback: decodes each export with opentelemetry-proto."""

from __future__ import annotations

import gzip
import threading
from email.message import Message

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from servers import HttpStub


class Receiver:
    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.arrived = threading.Condition()
        self._stub: HttpStub | None = None

    def _answer(self, method: str, path: str, headers: Message, body: bytes) -> tuple[int, str, bytes]:
        if headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportMetricsServiceRequest.FromString(body)
        with self.arrived:
            self.requests.append(request)
            self.arrived.notify_all()
        reply = ExportMetricsServiceResponse().SerializeToString()
        return 200 if path == "/v1/metrics" else 404, "application/x-protobuf", reply

    @property
    def endpoint(self) -> str:
        assert self._stub is not None, "use the receiver as a context manager"
        return self._stub.url

    def __enter__(self) -> Receiver:
        self._stub = HttpStub(self._answer)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stub is not None
        self._stub.close()

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
