"""Every catalogue metric's series in one ``View``: their names, labels and values, decided once
for every exposition (Prometheus text, ``collector``; OTLP, ``otlp``).

Names, kinds, help, labels and buckets come from ``nvrx_slo.contracts.catalogue``; every catalogue
metric is listed (one whose value is not known yet has no series). Values are the snapshot's:
numbers, and the engine's histograms as they are (an exposition reads them at the catalogue's
fewer ``buckets``, ``Histogram.cumulative_at``).

Cardinality guard (see the catalogue's docstring): per-rank series can be switched off, and a
pod with more ranks than ``max_ranks`` falls back to the same single ``rank="all"`` series. That
series sums its ranks — rank-seconds, counts and histograms add up — except for two gauges
whose sum means nothing, which take the value that matters for alerting instead:
``last_step_timestamp_seconds`` the max (the most advanced rank), ``checkpoint_worker_up`` the
min (any dead worker shows). Stragglers are the rules' to find (a rank's mean step time against
the job's median rank, across pods); a rank="all" series' step time is its ranks' mean.

NVML idle time is reported per device; device *i* is attributed to the pod's *i*-th lowest
rank (torchrun numbers a node's ranks contiguously, local rank = device index).

Fault seconds are one series per cause the pod has seen (at most ``len(FaultCause)`` - 1: a pod
never says ``pod_lost``), not one per cause known: a pod without faults exports none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prometheus_client.utils import INF, floatToGoString

from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.contracts.catalogue import ALL_RANKS, GpuIdleSource, Kind
from nvrx_slo.contracts.schema import RejectReason
from nvrx_slo.exporter.engine.snapshot import Histogram, RankSnapshot
from nvrx_slo.exporter.identity import PodIdentity
from nvrx_slo.exporter.views.view import View

_ALL_RANKS_AGGREGATE: dict[str, Callable[[Sequence[float]], float]] = {
    cat.LAST_STEP_TIMESTAMP.name: max,
    cat.CKPT_WORKER_UP.name: min,
}

_Items = tuple[tuple[str, str], ...]
Labels = dict[str, str]  # one object per label set (``LabelSets``): never mutated


def exposed_name(metric: cat.Metric) -> str:
    """The name a metric's family goes by: a counter's without ``_total``, which Prometheus' text
    format adds to its samples and OTLP-to-Prometheus translation to a monotonic sum."""
    return metric.name[: -len("_total")] if metric.kind is Kind.COUNTER else metric.name


_LABEL_SETS_MAX = 1 << 18


class LabelSets:
    """Interned label dicts, one per distinct label set, kept across scrapes.

    The series of a pod barely change between scrapes, so reusing the same dict objects lets
    ``exposition.TextRenderer`` render each label set's text once, not once per scrape.
    """

    def __init__(self) -> None:
        self._sets: dict[_Items, Labels] = {}
        self._buckets: dict[tuple[_Items, tuple[float, ...]], list[Labels]] = {}
        self._rank_sets: dict[tuple[tuple[_Items, ...], _Items], list[Labels]] = {}

    def get(self, items: _Items) -> Labels:
        labels = self._sets.get(items)
        if labels is None:
            if len(self._sets) > _LABEL_SETS_MAX:
                self._sets.clear()
            labels = self._sets[items] = dict(items)
        return labels

    def ranks(self, rank_items: tuple[_Items, ...], extra: _Items) -> list[Labels]:
        """The label sets of one per-rank series each: ``rank_items[i] + extra``."""
        key = (rank_items, extra)
        sets = self._rank_sets.get(key)
        if sets is None:
            if len(self._rank_sets) > _LABEL_SETS_MAX:
                self._rank_sets.clear()
            sets = self._rank_sets[key] = [self.get(items + extra) for items in rank_items]
        return sets

    def buckets(self, labels: Labels, bounds: tuple[float, ...]) -> list[Labels]:
        """The ``le`` label sets of a histogram's buckets, ``+Inf`` last."""
        items = tuple(labels.items())
        key = (items, bounds)
        sets = self._buckets.get(key)
        if sets is None:
            if len(self._buckets) > _LABEL_SETS_MAX:
                self._buckets.clear()
            sets = self._buckets[key] = [self.get(items + (("le", floatToGoString(b)),)) for b in (*bounds, INF)]
        return sets


@dataclass
class Series:
    """One metric's series: ``values`` for a counter or gauge, ``histograms`` for a histogram or summary."""

    metric: cat.Metric
    values: list[tuple[Labels, float]] = field(default_factory=list)
    histograms: list[tuple[Labels, Histogram]] = field(default_factory=list)


class _Series:
    """The series of one ``View`` under construction, one list per catalogue metric."""

    def __init__(self, view: View, identity: PodIdentity, per_rank: bool, max_ranks: int, lab: LabelSets) -> None:
        snap = view.snapshot
        self.lab = lab
        self.base: _Items = (("namespace", identity.namespace), ("job_name", identity.job_name or snap.job),
                             ("pod", identity.pod or snap.pod))
        self.base_labels = lab.get(self.base)
        self.ranks = snap.ranks
        self.split = per_rank and len(self.ranks) <= max_ranks
        self.rank_items = (tuple(self.base + (("rank", str(r.rank)),) for r in self.ranks) if self.split
                           else (self.base + (("rank", ALL_RANKS),),))
        self.out = {m.name: Series(m) for m in cat.CATALOGUE}

    def per_rank(self, metric: cat.Metric, values: Sequence[float | None], extra: _Items = ()) -> None:
        if self.split:
            self.out[metric.name].values += [
                (labels, value) for labels, value in zip(self.lab.ranks(self.rank_items, extra), values, strict=True)
                if value is not None]
            return
        known = [v for v in values if v is not None]
        if known:
            agg = _ALL_RANKS_AGGREGATE.get(metric.name, sum)
            self.out[metric.name].values.append((self.lab.get(self.rank_items[0] + extra), agg(known)))

    def of_ranks(self, metric: cat.Metric, get: Callable[[RankSnapshot], float | None], extra: _Items = ()) -> None:
        self.per_rank(metric, [get(r) for r in self.ranks], extra)

    def single(self, metric: cat.Metric, value: float | None, extra: _Items = ()) -> None:
        if value is not None:
            self.out[metric.name].values.append((self.lab.get(self.base + extra) if extra else self.base_labels, value))

    def histogram(self, metric: cat.Metric, hist: Histogram, extra: _Items = ()) -> None:
        self.out[metric.name].histograms.append((self.lab.get(self.base + extra) if extra else self.base_labels, hist))


def _ranks(b: _Series, view: View) -> None:
    """The ranks' time, steps and pod-level facts about them."""
    snap, ranks = view.snapshot, b.ranks
    b.of_ranks(cat.WALL, lambda r: r.wall_s)
    for category in cat.SETTLED_CATEGORIES:
        b.per_rank(cat.TIME, [r.seconds.get(category, 0.0) for r in ranks], (("category", category.value),))
    b.of_ranks(cat.UNPROTECTED_WORK, lambda r: r.unprotected_s)
    if ranks:
        b.single(cat.WORK_AT_RISK, sum(r.at_risk_s for r in ranks))
    b.of_ranks(cat.STEPS, lambda r: r.steps)
    b.single(cat.TRAINING_STEP, snap.latest_step)
    b.of_ranks(cat.LAST_STEP_TIMESTAMP, lambda r: r.last_step_wall)
    timers = [r.step_timer for r in ranks]
    for timer in sorted({t for t in timers if t is not None}):
        b.single(cat.STEP_TIMING_RANKS, timers.count(timer), (("timer", timer.value),))
    if ranks:
        steps = b.out[cat.STEP_DURATION.name].histograms
        if b.split:
            steps += [(b.lab.get(items), r.step_duration) for items, r in zip(b.rank_items, ranks, strict=True)]
        else:
            steps.append((b.lab.get(b.rank_items[0]), Histogram.merged([r.step_duration for r in ranks])))
    b.single(cat.JOB_START_TIMESTAMP, snap.job_start_wall)
    b.single(cat.JOB_WORLD_SIZE, snap.world_size)
    b.single(cat.POD_RANKS, snap.pod_ranks)


def _saves_and_restarts(b: _Series, view: View) -> None:
    ck, rs = view.snapshot.checkpoints, view.snapshot.restarts
    b.histogram(cat.CKPT_BLOCKING, ck.blocking)
    b.histogram(cat.CKPT_BACKGROUND, ck.background)
    b.single(cat.CKPT_LAST_SUCCESS, ck.last_success_wall)
    b.single(cat.CKPT_LAST_STEP, ck.last_success_step)
    b.single(cat.CKPT_FAILURES, ck.failures)
    b.single(cat.CKPT_IN_FLIGHT, ck.in_flight)
    b.single(cat.CKPT_BYTES, ck.bytes_total)
    b.of_ranks(cat.CKPT_WORKER_UP, lambda r: None if r.worker_alive is None else float(r.worker_alive))
    for level, n in rs.counts.items():
        b.single(cat.RESTARTS, n, (("level", level.value),))
    for level, hist in rs.duration.items():
        b.histogram(cat.RESTART_DURATION, hist, (("level", level.value),))
    for (level, phase), hist in rs.phases.items():
        b.single(cat.RESTART_PHASE, hist.sum, (("level", level.value), ("phase", phase.value)))
    b.single(cat.LAUNCHER_RESTARTS_REMAINING, rs.launcher_remaining)


def _spans_devices_causes(b: _Series, view: View) -> None:
    snap, ranks = view.snapshot, b.ranks
    for name, seconds in sorted(snap.user_spans.items()):
        b.single(cat.USER_SPAN_TIME, seconds, (("name", name),))
    b.of_ranks(cat.GPU_IDLE, lambda r: r.gpu_idle_s, (("source", GpuIdleSource.STEP_PHASES.value),))
    if view.gpu_idle_nvml:
        by_rank = dict(zip(sorted(r.rank for r in ranks), (view.gpu_idle_nvml.get(i) for i in range(len(ranks))),
                           strict=True))
        b.per_rank(cat.GPU_IDLE, [by_rank.get(r.rank) for r in ranks], (("source", GpuIdleSource.NVML.value),))
    by_cause: dict[str, float] = {}
    for (_, fault), seconds in snap.caused.items():
        by_cause[fault.value] = by_cause.get(fault.value, 0.0) + seconds
    for name, seconds in sorted(by_cause.items()):
        b.single(cat.FAULT_TIME, seconds, (("cause", name),))
    if ranks:
        b.single(cat.RANK_ACCELERATORS, view.accelerators.per_rank, (("accelerator", view.accelerators.model),))


def _exporter(b: _Series, view: View) -> None:
    snap = view.snapshot
    b.single(cat.EXPORTER_EVENTS, snap.events_accepted)
    for reason in sorted({r.value for r in RejectReason} | set(view.rejected)):
        b.single(cat.EXPORTER_REJECTED, view.rejected.get(reason, 0), (("reason", reason),))
    b.single(cat.EXPORTER_RECORDS_LOST, snap.records_lost)
    b.single(cat.EXPORTER_LAG, snap.journal_lag_s)
    for (container, reason), n in sorted(view.pod_restarts.items()):
        b.single(cat.POD_RESTARTS, n, (("container", container), ("reason", reason)))


def series(view: View, identity: PodIdentity, *, per_rank: bool, max_ranks: int,
           labels: LabelSets | None = None) -> list[Series]:
    """Every catalogue metric's series in ``view``, in catalogue order."""
    b = _Series(view, identity, per_rank, max_ranks, labels or LabelSets())
    for part in (_ranks, _saves_and_restarts, _spans_devices_causes, _exporter):
        part(b, view)
    return list(b.out.values())
