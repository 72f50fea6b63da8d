"""The Prometheus collector over a hand-built view: the full catalogue, right labels, lint-clean text."""

from __future__ import annotations

import subprocess

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from needs import tool
from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.contracts.schema import RejectReason
from nvrx_slo.exporter.identity import PodIdentity
from nvrx_slo.exporter.views.collector import SnapshotCollector
from nvrx_slo.exporter.views.exposition import TextRenderer
from nvrx_slo.exporter.views.view import AcceleratorsSaid, View
from snapshot_fixtures import snapshot

IDENT = PodIdentity(namespace="train", pod="pod-0", node="node-0", job_name="llm")


def scrape(view: View, **kw) -> tuple[bytes, dict]:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: view, IDENT, **kw))
    text = TextRenderer().generate(registry)
    return text, {f.name: f for f in text_string_to_metric_families(text.decode())}


def value(fams: dict, metric: cat.Metric, suffix: str = "", **labels: str) -> float:
    name = metric.name[: -len("_total")] if metric.kind is cat.Kind.COUNTER else metric.name
    hits = [s.value for s in fams[name].samples
            if s.name == metric.name + suffix and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (metric.name, labels, hits)
    return hits[0]


def view(n_ranks: int = 2, **kw) -> View:
    return View(snapshot(n_ranks), {"malformed": 4}, kw.get("nvml", {}), {("trainer", "OOMKilled"): 2})


def test_every_catalogue_metric_once_with_its_help_type_and_labels():
    text, fams = scrape(view())
    assert len(fams) == len(cat.CATALOGUE)
    for m in cat.CATALOGUE:
        fam = fams[m.name[: -len("_total")] if m.kind is cat.Kind.COUNTER else m.name]
        assert (fam.type, fam.documentation) == (m.kind.value, m.help)
        for s in fam.samples:
            assert set(s.labels) - {"le"} == set(m.all_labels), (m.name, s.labels)
            if m.kind is cat.Kind.HISTOGRAM and s.name.endswith("_bucket"):
                assert float(s.labels["le"]) in (*m.buckets, float("inf"))


def test_time_categories_and_unprotected_sum_to_wall_per_rank():
    _, fams = scrape(view(3))
    for r in ("0", "1", "2"):
        settled = sum(value(fams, cat.TIME, rank=r, category=c.value) for c in cat.SETTLED_CATEGORIES)
        assert settled + value(fams, cat.UNPROTECTED_WORK, rank=r) == pytest.approx(value(fams, cat.WALL, rank=r))


@pytest.mark.parametrize("kw", [{"per_rank": False}, {"max_ranks": 2}], ids=["switched off", "over the cap"])
def test_rank_all_sums_counters_and_takes_the_alerting_extreme_of_gauges(kw):
    _, fams = scrape(view(3), **kw)
    assert {s.labels.get("rank") for f in fams.values() for s in f.samples} <= {"all", None}
    assert value(fams, cat.WALL, rank="all") == 300.0
    assert value(fams, cat.STEPS, rank="all") == 100 + 101 + 102
    assert value(fams, cat.STEP_DURATION, "_count", rank="all") == 9
    assert value(fams, cat.STEP_DURATION, "_sum", rank="all") == pytest.approx(sum(1.4 + r for r in range(3)))
    assert value(fams, cat.TRAINING_STEP) == 101  # the pod's most advanced rank
    assert value(fams, cat.CKPT_WORKER_UP, rank="all") == 0.0  # rank 1's worker is dead
    assert value(fams, cat.GPU_IDLE, rank="all", source="step_phases") == 5 + 6 + 7


def test_exporter_counters_have_every_reason_and_pod_restarts():
    _, fams = scrape(view())
    for reason in (r.value for r in RejectReason):
        expected = {"malformed": 4}.get(reason, 0)
        assert value(fams, cat.EXPORTER_REJECTED, reason=reason) == expected
    assert value(fams, cat.EXPORTER_EVENTS) == 1234
    assert value(fams, cat.POD_RESTARTS, container="trainer", reason="OOMKilled") == 2
    assert value(fams, cat.RESTARTS, level="injob") == 1 and value(fams, cat.RESTARTS, level="pod") == 0


def test_nvml_idle_is_labelled_by_source_and_mapped_to_the_pods_ranks():
    _, fams = scrape(view(2, nvml={0: 7.5, 1: 3.0}))
    assert value(fams, cat.GPU_IDLE, rank="0", source="nvml") == 7.5
    assert value(fams, cat.GPU_IDLE, rank="1", source="nvml") == 3.0
    assert value(fams, cat.GPU_IDLE, rank="1", source="step_phases") == 6.0


def test_fast_text_parses_to_what_prometheus_client_renders():
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(view, IDENT))
    ours = list(text_string_to_metric_families(TextRenderer().generate(registry).decode()))
    theirs = list(text_string_to_metric_families(generate_latest(registry).decode()))
    assert ours == theirs


def test_each_scrape_builds_fresh_families_from_a_fresh_view_on_an_owned_registry():
    views = iter([view(1), view(2)])
    collector = SnapshotCollector(lambda: next(views), IDENT)
    registry = CollectorRegistry()
    registry.register(collector)
    assert collector not in REGISTRY._collector_to_names
    first, second = list(registry.collect()), list(registry.collect())
    assert all(a is not b for a, b in zip(first, second, strict=True))
    assert len(first[0].samples) == 1 and len(second[0].samples) == 2


def test_nothing_before_the_state_is_loaded():
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: None, IDENT))
    assert TextRenderer().generate(registry) == b""


@pytest.mark.parametrize("per_rank", [True, False])
@pytest.mark.external
def test_promtool_check_metrics_is_clean(per_rank):
    text, _ = scrape(view(4), per_rank=per_rank)
    proc = subprocess.run([tool("promtool"), "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout + proc.stderr == b"", proc.stdout + proc.stderr


def test_the_renderer_reuses_label_text_across_scrapes_and_stays_right():
    snaps = iter([snapshot(2), snapshot(2, events_accepted=99)])
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: View(next(snaps), {}, {}, {}), IDENT))
    renderer = TextRenderer()
    first, second = renderer.generate(registry), renderer.generate(registry)
    assert first.replace(b"nvrx_exporter_events_total{namespace=\"train\",job_name=\"llm\",pod=\"pod-0\"} 1234",
                         b"nvrx_exporter_events_total{namespace=\"train\",job_name=\"llm\",pod=\"pod-0\"} 99") == second


def test_every_catalogue_metric_is_fed_from_the_snapshot():
    """A catalogue metric the snapshot cannot fill shows up here, not as a silent empty family."""
    _, fams = scrape(View(snapshot(2), {}, {0: 1.0}, {("trainer", "Error"): 1}))
    empty = {m.name for m in cat.CATALOGUE
             if not fams[m.name[: -len("_total")] if m.kind is cat.Kind.COUNTER else m.name].samples}
    assert empty == set()


def test_an_exported_histogram_reads_the_engines_cumulative_counts_at_its_own_bounds():
    """The engine keeps finer buckets than a pod exports; each exported bucket is the engine's
    cumulative count at that bound (no interpolation), the SLO's 10 s threshold among them."""
    snap = view(2).snapshot
    _, fams = scrape(view(2))
    for level, hist in snap.restarts.duration.items():
        for bound in cat.RESTART_DURATION.buckets:
            expected = hist.counts[hist.bounds.index(bound)]
            assert value(fams, cat.RESTART_DURATION, "_bucket", level=level.value, le=str(bound)) == expected
        assert value(fams, cat.RESTART_DURATION, "_bucket", level=level.value, le="+Inf") == hist.count
    assert 10.0 in cat.RESTART_DURATION.buckets
    for metric, engine_bounds in ((cat.RESTART_DURATION, cat.RESTART_BUCKETS),
                                  (cat.CKPT_BLOCKING, cat.CHECKPOINT_BUCKETS),
                                  (cat.CKPT_BACKGROUND, cat.CHECKPOINT_BUCKETS)):
        assert set(metric.buckets) <= set(engine_bounds), metric.name


def test_an_eight_rank_pod_exports_at_most_250_series():
    """The series budget (issue 12): every rank's accounting, summaries for means, few buckets."""
    text, _ = scrape(view(8, nvml={i: 1.0 for i in range(8)}))
    series = [line for line in text.decode().splitlines() if line and not line.startswith("#")]
    assert len(series) <= 250, len(series)



def test_fault_seconds_are_one_series_per_cause_seen_and_the_accelerators_one_per_pod():
    """The lost and restart seconds by cause, summed over both categories and the pod's ranks (the
    snapshot's ``caused``); causes the pod never saw have no series. Each rank's accelerators, with
    the model its cost is priced by: as said per rank, or a pod's shared by the ranks it accounts."""
    snap = view(2).snapshot
    _, fams = scrape(View.of(snap, {}, accelerators=AcceleratorsSaid("NVIDIA H100 80GB HBM3", per_rank=8.0)))
    assert [s.labels["cause"] for s in fams["nvrx_fault_seconds"].samples] == ["killed"]
    assert value(fams, cat.FAULT_TIME, cause="killed") == sum(snap.caused.values()) == 3.0 * 2
    assert value(fams, cat.RANK_ACCELERATORS, accelerator="NVIDIA H100 80GB HBM3") == 8.0
    _, fams = scrape(View.of(snap, {}))
    assert value(fams, cat.RANK_ACCELERATORS, accelerator="unknown") == 1.0
    _, fams = scrape(View.of(snap, {}, accelerators=AcceleratorsSaid(per_pod=8.0)))
    assert snap.rank_count == 2 and value(fams, cat.RANK_ACCELERATORS, accelerator="unknown") == 4.0
