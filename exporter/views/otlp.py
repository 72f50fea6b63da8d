"""The OTLP view: the same families as /metrics, through opentelemetry-sdk, over OTLP/HTTP.

One ``MeterProvider`` whose resource carries the pod's Kubernetes identity
(``k8s.namespace.name``, ``k8s.pod.name``, ``k8s.node.name``, ``k8s.job.name``). Counters and
gauges are observable instruments whose callbacks read ``collector.families`` of one ``View``
(cached for a collection, so every instrument of one export sees the same instant). The
identity labels become the resource; the other labels (rank, category, level, …) become
attributes. Counter names drop Prometheus' ``_total``: OTLP-to-Prometheus translation adds it
back for monotonic sums.

The OTel API has no observable histogram, and our histograms are already aggregated by the
engine, so they are appended to each export as cumulative histogram points built from the same
cached families (``_WithHistograms``) — same data, one more data model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    HistogramDataPoint,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
    ResourceMetrics,
    ScopeMetrics,
)
from opentelemetry.sdk.metrics.export import Histogram as OtelHistogram
from opentelemetry.sdk.metrics.export import Metric as OtelMetric
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.metrics_core import Metric as PromFamily

from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.contracts.catalogue import Kind
from nvrx_slo.exporter.identity import Identity
from nvrx_slo.exporter.views.collector import LabelSets, families
from nvrx_slo.exporter.views.view import View

SCOPE = "nvrx-slo"
SERVICE_NAME = "nvrx-slo-sidecar"


def otel_name(metric: cat.Metric) -> str:
    return metric.name[: -len("_total")] if metric.kind is Kind.COUNTER else metric.name


def metrics_url(endpoint: str) -> str:
    """``http://host:4318`` → ``http://host:4318/v1/metrics``; a URL with a path is kept as given."""
    return endpoint.rstrip("/") + "/v1/metrics" if urlsplit(endpoint).path in ("", "/") else endpoint


def _attributes(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k not in cat.IDENTITY_LABELS}


class OtlpView:
    """The families of one ``View`` per collection, as observations and histogram points."""

    def __init__(self, view: Callable[[], View | None], identity: Identity, *, per_rank: bool, max_ranks: int,
                 reuse_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._view = view
        self._identity = identity
        self._per_rank = per_rank
        self._max_ranks = max_ranks
        self._reuse_s = reuse_s
        self._clock = clock
        self._labels = LabelSets()
        self._cached: tuple[float, dict[str, PromFamily], float | None] | None = None

    def current(self) -> tuple[dict[str, PromFamily], float | None] | None:
        """Families by catalogue name and the job's start (Unix s), reused within ``reuse_s``."""
        now = self._clock()
        if self._cached is None or now - self._cached[0] > self._reuse_s:
            view = self._view()
            if view is None:
                return None
            fams = families(view, self._identity, per_rank=self._per_rank, max_ranks=self._max_ranks,
                            labels=self._labels)
            self._cached = (now, {m.name: f for m, f in zip(cat.CATALOGUE, fams, strict=True)},
                            view.snapshot.job_start_wall)
        return self._cached[1], self._cached[2]

    def register(self, meter: Meter) -> None:
        """One observable instrument per catalogue counter and gauge."""
        for metric in cat.CATALOGUE:
            callback = self._callback(metric)
            if metric.kind is Kind.COUNTER:
                meter.create_observable_counter(otel_name(metric), [callback], description=metric.help)
            elif metric.kind is Kind.GAUGE:
                meter.create_observable_gauge(otel_name(metric), [callback], description=metric.help)

    def _callback(self, metric: cat.Metric) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(_: CallbackOptions) -> Iterable[Observation]:
            current = self.current()
            if current is None:
                return []
            return [Observation(s.value, _attributes(s.labels)) for s in current[0][metric.name].samples]
        return observe

    def histograms(self, now_ns: int) -> list[OtelMetric]:
        current = self.current()
        if current is None:
            return []
        fams, start_wall = current
        start_ns = int(start_wall * 1e9) if start_wall is not None else now_ns
        return [_histogram(m, fams[m.name], start_ns, now_ns) for m in cat.CATALOGUE
                if m.kind in (Kind.HISTOGRAM, Kind.SUMMARY)]


def _histogram(metric: cat.Metric, family: PromFamily, start_ns: int, now_ns: int) -> OtelMetric:
    """Prometheus-style cumulative ``_bucket``/``_sum``/``_count`` samples to OTLP histogram points (a
    summary's: one bucket, its count — the OTel SDK has no summary points to build)."""
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
    for s in family.samples:
        key = tuple(sorted((k, v) for k, v in _attributes(s.labels).items() if k != "le"))
        point = series.setdefault(key, {"cumulative": []})
        if s.name.endswith("_bucket"):
            point["cumulative"].append(s.value)
        else:
            point[s.name.rsplit("_", 1)[1]] = s.value
    points = []
    for key, point in series.items():
        cumulative: Sequence[float] = point["cumulative"] or [point["count"]]
        counts = [int(c - p) for c, p in zip(cumulative, [0.0, *cumulative[:-1]], strict=True)]
        points.append(HistogramDataPoint(
            attributes=dict(key), start_time_unix_nano=start_ns, time_unix_nano=now_ns, count=int(point["count"]),
            sum=float(point["sum"]), bucket_counts=counts, explicit_bounds=list(metric.buckets),
            min=None, max=None))  # type: ignore[arg-type]  # unknown: left out of the OTLP point
    return OtelMetric(name=metric.name, description=metric.help, unit="",
                      data=OtelHistogram(data_points=points, aggregation_temporality=AggregationTemporality.CUMULATIVE))


class _WithHistograms(MetricExporter):
    """Passes each export on with the engine's histograms added to our scope."""

    def __init__(self, inner: MetricExporter, view: OtlpView) -> None:
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self._inner = inner
        self._view = view

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: object) -> MetricExportResult:
        extra = self._view.histograms(time.time_ns())
        resource_metrics = []
        for rm in metrics_data.resource_metrics:
            scopes = [ScopeMetrics(sm.scope, [*sm.metrics, *extra] if sm.scope.name == SCOPE else sm.metrics,
                                   sm.schema_url) for sm in rm.scope_metrics]
            if extra and not any(sm.scope.name == SCOPE for sm in rm.scope_metrics):
                scopes.append(ScopeMetrics(InstrumentationScope(SCOPE), extra, ""))
            resource_metrics.append(ResourceMetrics(rm.resource, scopes, rm.schema_url))
        return self._inner.export(MetricsData(resource_metrics), timeout_millis=timeout_millis)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self._inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        self._inner.shutdown(timeout_millis=timeout_millis, **kwargs)


def start(view: Callable[[], View | None], identity: Identity, *, endpoint: str, interval_s: float,
          per_rank: bool, max_ranks: int) -> MeterProvider:
    """Export every ``interval_s`` to ``endpoint``; ``shutdown()`` the provider to send a last export."""
    otlp_view = OtlpView(view, identity, per_rank=per_rank, max_ranks=max_ranks)
    exporter = _WithHistograms(OTLPMetricExporter(endpoint=metrics_url(endpoint)), otlp_view)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=interval_s * 1000)
    resource = Resource.create({"service.name": SERVICE_NAME, **identity.resource_attributes()})
    provider = MeterProvider(resource=resource, metric_readers=[reader])
    otlp_view.register(provider.get_meter(SCOPE))
    return provider
