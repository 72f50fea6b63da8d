"""OTLP export through opentelemetry-sdk to a real OTLP/HTTP endpoint on loopback."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

import stories
from journal_fixtures import write_clean
from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.events import as_event
from nvrx_slo.exporter.identity import PodIdentity
from nvrx_slo.exporter.views import otlp
from nvrx_slo.exporter.views.collector import SnapshotCollector, families
from nvrx_slo.exporter.views.exposition import TextRenderer
from nvrx_slo.exporter.views.series import exposed_name
from nvrx_slo.exporter.views.view import View
from otlp_receiver import Receiver, metrics_by_name, point_attributes, resource_attributes
from snapshot_fixtures import snapshot

IDENT = PodIdentity(namespace="train", pod="pod-0", node="node-7", job_name="llm", replica_index=1)


def export_once(view: View, **kw) -> dict:
    with Receiver() as receiver:
        provider = otlp.start(lambda: view, IDENT, endpoint=receiver.endpoint, interval_s=3600,
                              per_rank=kw.get("per_rank", True), max_ranks=64)
        try:
            assert provider.force_flush(10_000)
        finally:
            provider.shutdown()
        [request, *_] = receiver.wait(1)
    return {"resource": resource_attributes(request), "metrics": metrics_by_name(request)}


def test_export_carries_k8s_identity_and_every_catalogue_metric():
    got = export_once(View(snapshot(2), {"malformed": 4}, {}, {}))
    assert {k: v for k, v in got["resource"].items() if k.startswith("k8s.")} == {
        "k8s.namespace.name": "train", "k8s.pod.name": "pod-0", "k8s.node.name": "node-7", "k8s.job.name": "llm",
        "k8s.job.completion_index": 1}
    assert got["resource"]["service.name"] == "nvrx-slo-sidecar"
    prometheus_side = families(View(snapshot(2), {"malformed": 4}, {}, {}), IDENT, per_rank=True, max_ranks=64)
    with_samples = {exposed_name(m) for m, f in zip(cat.CATALOGUE, prometheus_side, strict=True) if f.samples}
    assert set(got["metrics"]) == with_samples  # the same metrics as /metrics, each with data
    [remaining] = got["metrics"][cat.LAUNCHER_RESTARTS_REMAINING.name].gauge.data_points
    assert (remaining.WhichOneof("value"), remaining.as_int) == ("as_int", 2)


def test_counters_are_cumulative_monotonic_sums_with_rank_attributes():
    metrics = export_once(View(snapshot(2), {}, {}, {}))["metrics"]
    wall = metrics["nvrx_wall_seconds"].sum
    assert wall.is_monotonic and wall.aggregation_temporality == 2  # CUMULATIVE
    assert {point_attributes(p)["rank"]: p.as_double for p in wall.data_points} == {"0": 100.0, "1": 100.0}
    time = metrics["nvrx_time_seconds"].sum.data_points
    assert {(point_attributes(p)["rank"], point_attributes(p)["category"]) for p in time} == {
        (r, c.value) for r in ("0", "1") for c in cat.SETTLED_CATEGORIES}
    lag = metrics["nvrx_exporter_journal_lag_seconds"].gauge.data_points
    assert [p.as_double for p in lag] == [0.4] and point_attributes(lag[0]) == {}


def test_histograms_arrive_as_cumulative_bucketed_points():
    metrics = export_once(View(snapshot(2), {}, {}, {}))["metrics"]
    restart = metrics["nvrx_restart_duration_seconds"].histogram
    assert restart.aggregation_temporality == 2
    injob = next(p for p in restart.data_points if point_attributes(p) == {"level": "injob"})
    bounds = list(cat.RESTART_DURATION.buckets)
    assert (injob.count, injob.sum) == (1, 3.0) and list(injob.explicit_bounds) == bounds
    assert sum(injob.bucket_counts) == 1 and injob.bucket_counts[bounds.index(5.0)] == 1
    assert injob.start_time_unix_nano == int(1.7e9 * 1e9)
    # a summary (sum and count: what a mean needs) arrives as a histogram point of one bucket
    steps = metrics["nvrx_step_duration_seconds"].histogram.data_points
    assert sorted(point_attributes(p)["rank"] for p in steps) == ["0", "1"]
    assert all(list(p.explicit_bounds) == [] and list(p.bucket_counts) == [p.count] for p in steps)


def test_the_cardinality_guard_applies_to_otlp_too():
    metrics = export_once(View(snapshot(3), {}, {}, {}), per_rank=False)["metrics"]
    wall = metrics["nvrx_wall_seconds"].sum.data_points
    assert [(point_attributes(p), p.as_double) for p in wall] == [({"rank": "all"}, 300.0)]


def test_nothing_is_observed_before_the_state_is_loaded():
    with Receiver() as receiver:
        provider = otlp.start(lambda: None, IDENT, endpoint=receiver.endpoint, interval_s=3600,
                              per_rank=True, max_ranks=64)
        provider.force_flush(10_000)
        provider.shutdown()
        assert all(not metrics_by_name(r) for r in receiver.requests)


def _replayed() -> View:
    """A real engine's view of a story with a crash, a rollback and saves."""
    pod = stories.crash_with_rollback()
    engine = Engine()
    for record in sorted(pod.records, key=lambda r: r["mono"]):
        engine.ingest(as_event(record))
    newest = max(pod.records, key=lambda r: r["mono"])
    return View.of(engine.snapshot(newest["mono"] + 5.0, newest["wall"] + 5.0), {"malformed": 1})


def _served(view: View, per_rank: bool) -> dict[tuple[str, frozenset], float]:
    """What /metrics serves for ``view``, read back by prometheus-client's parser: each sample by
    its name and its labels (the identity labels apart: OTLP carries them as the resource)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: view, IDENT, per_rank=per_rank))
    out = {}
    for family in text_string_to_metric_families(TextRenderer().generate(registry).decode()):
        for s in family.samples:
            assert [s.labels[k] for k in cat.IDENTITY_LABELS] == ["train", "llm", "pod-0"]
            out[(s.name, frozenset((k, v) for k, v in s.labels.items() if k not in cat.IDENTITY_LABELS))] = s.value
    return out


def _as_served(metrics: dict) -> dict[tuple[str, frozenset], float]:
    """The OTLP export written as Prometheus samples: a sum or gauge point is the metric's sample,
    a histogram point its cumulative ``_bucket`` samples, ``_sum`` and ``_count`` (a summary's
    only the last two)."""
    out = {}
    for m in cat.CATALOGUE:
        if (got := metrics.get(exposed_name(m))) is None:
            continue
        kind = got.WhichOneof("data")
        assert kind == {cat.Kind.COUNTER: "sum", cat.Kind.GAUGE: "gauge"}.get(m.kind, "histogram"), m.name
        for p in getattr(got, kind).data_points:
            attrs = frozenset(point_attributes(p).items())
            if kind != "histogram":
                out[(m.name, attrs)] = getattr(p, p.WhichOneof("value"))
                continue
            if m.kind is cat.Kind.HISTOGRAM:
                cumulative = 0
                for bound, n in zip([*p.explicit_bounds, float("inf")], p.bucket_counts, strict=True):
                    cumulative += n
                    out[(m.name + "_bucket", attrs | {("le", floatToGoString(bound))})] = cumulative
            out[(m.name + "_sum", attrs)], out[(m.name + "_count", attrs)] = p.sum, p.count
    return out


@pytest.mark.parametrize("make, per_rank, every", [
    (lambda: View(snapshot(2), {"malformed": 4}, {0: 7.5, 1: 3.0}, {("trainer", "OOMKilled"): 2}), True, True),
    (lambda: View(snapshot(3), {}, {0: 1.0}, {}), False, False),
    (_replayed, True, False),
], ids=["fixture", "rank all", "replayed journal"])
def test_every_catalogue_metric_arrives_with_the_values_metrics_serves(make, per_rank, every):
    view = make()
    served = _served(view, per_rank)
    with Receiver() as receiver:
        export = otlp.start(lambda: view, IDENT, endpoint=receiver.endpoint, interval_s=3600,
                            per_rank=per_rank, max_ranks=64)
        try:
            assert export.force_flush(10_000)
        finally:
            export.shutdown()
        [request, *_] = receiver.wait(1)
    assert _as_served(metrics_by_name(request)) == served
    assert resource_attributes(request)["k8s.pod.name"] == "pod-0"
    if every:  # the fixture feeds every catalogue metric (test_collector): none can be missing on both sides
        assert set(metrics_by_name(request)) == {exposed_name(m) for m in cat.CATALOGUE}


def test_metrics_url():
    assert otlp.metrics_url("http://c:4318") == "http://c:4318/v1/metrics"
    assert otlp.metrics_url("http://c:4318/") == "http://c:4318/v1/metrics"
    assert otlp.metrics_url("https://c/otlp/v1/metrics") == "https://c/otlp/v1/metrics"


def test_the_sidecar_exports_the_same_numbers_it_serves(tmp_path):
    from sidecar_process import SidecarProcess, value

    write_clean(tmp_path / "journal")
    with Receiver() as receiver:
        with SidecarProcess(tmp_path / "journal", tmp_path / "state.json", tmp_path / "log",
                            "--otlp-endpoint", receiver.endpoint, "--otlp-interval", "0.3") as proc:
            proc.wait_ready()
            served = proc.scrape()
            requests = receiver.wait(2)
            assert proc.stop()[0] == 0
    exported = [metrics_by_name(r) for r in requests if metrics_by_name(r)]
    assert exported, "no export carried data"
    steps = {point_attributes(p)["rank"]: p.as_double if p.HasField("as_double") else p.as_int
             for p in exported[-1]["nvrx_steps"].sum.data_points}
    assert steps == {r: value(served, "nvrx_steps_total", rank=r) for r in ("0", "1")}
    restart = exported[-1]["nvrx_restart_duration_seconds"].histogram.data_points
    injob = next(p for p in restart if point_attributes(p) == {"level": "injob"})
    assert injob.count == 1 and injob.sum == value(served, "nvrx_restart_duration_seconds_sum", level="injob")
