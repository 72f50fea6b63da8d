"""The OTLP view: the series /metrics serves (``series.series``), as OTLP/HTTP metrics through opentelemetry-sdk.

Each export renders one ``View`` into the SDK's public metrics data model (``MetricsData``: the
pod's resource, our scope, one ``Metric`` per catalogue metric that has series) and hands it to
the SDK's ``OTLPMetricExporter``. Nothing is aggregated on the way: the engine did that, and its
histograms are already histograms. Why not a ``MeterProvider`` with observable instruments: the
OTel API has no observable histogram, and each instrument's callback would take its own view
where one export must be one instant.

* The resource carries the pod's Kubernetes identity (``k8s.namespace.name``, ``k8s.pod.name``,
  ``k8s.node.name``, ``k8s.job.name``); the other labels (rank, category, level, …) become
  attributes.
* Counters are cumulative monotonic sums named without ``_total`` (OTLP-to-Prometheus translation
  adds it back), gauges are gauges, histograms cumulative histogram points at the catalogue's
  buckets; a summary is a histogram point of one bucket (the SDK has no summary point).
* Cumulative values count from the job's start, so that is every point's start time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    HistogramDataPoint,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.metrics.export import Histogram as OtelHistogram
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.contracts.catalogue import Kind
from nvrx_slo.exporter.identity import PodIdentity
from nvrx_slo.exporter.views.series import Labels, LabelSets, Series, exposed_name, series
from nvrx_slo.exporter.views.view import View

log = logging.getLogger("nvrx_slo.otlp")

SCOPE = "nvrx-slo"
SERVICE_NAME = "nvrx-slo-sidecar"
CUMULATIVE = AggregationTemporality.CUMULATIVE


def metrics_url(endpoint: str) -> str:
    """``http://host:4318`` → ``http://host:4318/v1/metrics``; a URL with a path is kept as given."""
    return endpoint.rstrip("/") + "/v1/metrics" if urlsplit(endpoint).path in ("", "/") else endpoint


def _attributes(labels: Labels) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k not in cat.IDENTITY_LABELS}


def _metric(s: Series, start_ns: int, now_ns: int) -> Metric | None:
    """One metric's series as OTLP data, or ``None`` without any."""
    m = s.metric
    if m.kind in (Kind.HISTOGRAM, Kind.SUMMARY):
        if not s.histograms:
            return None
        points = []
        for labels, hist in s.histograms:
            cumulative = hist.cumulative_at(m.buckets)  # a summary's: [count]
            points.append(HistogramDataPoint(
                attributes=_attributes(labels), start_time_unix_nano=start_ns, time_unix_nano=now_ns,
                count=hist.count, sum=hist.sum, explicit_bounds=m.buckets,
                bucket_counts=[c - p for c, p in zip(cumulative, [0, *cumulative[:-1]], strict=True)],
                min=None, max=None))  # type: ignore[arg-type]  # unknown: left out of the OTLP point
        return Metric(exposed_name(m), m.help, "", OtelHistogram(points, CUMULATIVE))
    if not s.values:
        return None
    numbers = [NumberDataPoint(_attributes(labels), start_ns, now_ns, value) for labels, value in s.values]
    data = Sum(numbers, CUMULATIVE, is_monotonic=True) if m.kind is Kind.COUNTER else Gauge(numbers)
    return Metric(exposed_name(m), m.help, "", data)


class OtlpExport:
    """Sends the series of ``view()`` to ``exporter`` every ``interval_s`` (none while it returns
    ``None``: the state is not loaded yet); ``shutdown()`` sends a last export."""

    def __init__(self, view: Callable[[], View | None], identity: PodIdentity, exporter: MetricExporter, *,
                 interval_s: float, per_rank: bool, max_ranks: int) -> None:
        self._view = view
        self._identity = identity
        self._exporter = exporter
        self._interval_s = interval_s
        self._per_rank = per_rank
        self._max_ranks = max_ranks
        self._labels = LabelSets()
        self._resource = Resource.create({"service.name": SERVICE_NAME, **identity.resource_attributes()})
        self._scope = InstrumentationScope(SCOPE)
        self._lock = threading.Lock()  # one export at a time: the timer's, a flush, the last one
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvrx-slo-otlp", daemon=True)

    def metrics_data(self) -> MetricsData | None:
        """The export of the current view; ``None`` before there is one."""
        view = self._view()
        if view is None:
            return None
        now_ns = time.time_ns()
        start = view.snapshot.job_start_wall
        start_ns = int(start * 1e9) if start is not None else now_ns
        metrics = [m for s in series(view, self._identity, per_rank=self._per_rank, max_ranks=self._max_ranks,
                                     labels=self._labels) if (m := _metric(s, start_ns, now_ns)) is not None]
        return MetricsData([ResourceMetrics(self._resource, [ScopeMetrics(self._scope, metrics, "")], "")])

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Export now; whether the endpoint took it (``True`` with nothing to send)."""
        with self._lock:
            data = self.metrics_data()
            return data is None or self._exporter.export(data, timeout_millis=timeout_millis) \
                is MetricExportResult.SUCCESS

    def start(self) -> OtlpExport:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.force_flush()
            except Exception:  # a view that failed now may render at the next export
                log.exception("OTLP export failed")

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        """Stop the timer, send a last export, close the exporter."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_millis / 1000)
        try:
            self.force_flush(timeout_millis)
        except Exception:  # the sidecar is on its way out: the state it saved matters more
            log.exception("last OTLP export failed")
        finally:
            self._exporter.shutdown(timeout_millis=timeout_millis)


def start(view: Callable[[], View | None], identity: PodIdentity, *, endpoint: str, interval_s: float,
          per_rank: bool, max_ranks: int) -> OtlpExport:
    """Export every ``interval_s`` to ``endpoint``; ``shutdown()`` it to send a last export."""
    exporter = OTLPMetricExporter(endpoint=metrics_url(endpoint))
    return OtlpExport(view, identity, exporter, interval_s=interval_s, per_rank=per_rank,
                      max_ranks=max_ranks).start()
