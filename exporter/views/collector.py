"""The Prometheus view: a prometheus-client custom collector that renders one ``View`` per scrape.

``collect()`` builds fresh metric families from a new view every time and increments nothing;
names, kinds, help, labels and buckets all come from ``nvrx_slo.contracts.catalogue``, and every catalogue
metric is emitted (a family whose value is not known yet carries no samples).

Cardinality guard (see the catalogue's docstring): per-rank series can be switched off, and a
pod with more ranks than ``max_ranks`` falls back to the same single ``rank="all"`` series. That
series sums its ranks — rank-seconds, counts and histograms add up — except for two gauges
whose sum means nothing, which take the value that matters for alerting instead:
``last_step_timestamp_seconds`` the max (the most advanced rank), ``checkpoint_worker_up`` the
min (any dead worker shows). Stragglers are the rules' to find (a rank's mean step time against
the job's median rank, across pods); a rank="all" series' step time is its ranks' mean.

NVML idle time is reported per device; device *i* is attributed to the pod's *i*-th lowest
rank (torchrun numbers a node's ranks contiguously, local rank = device index).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import INF, floatToGoString

from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.contracts.catalogue import ALL_RANKS, GpuIdleSource, Kind
from nvrx_slo.contracts.schema import RejectReason
from nvrx_slo.exporter.engine.snapshot import Histogram, RankSnapshot
from nvrx_slo.exporter.ingest.identity import Identity
from nvrx_slo.exporter.live import View

REJECT_REASONS: tuple[str, ...] = tuple(r.value for r in RejectReason)

_ALL_RANKS_AGGREGATE: dict[str, Callable[[Sequence[float]], float]] = {
    cat.LAST_STEP_TIMESTAMP.name: max,
    cat.CKPT_WORKER_UP.name: min,
}

_Items = tuple[tuple[str, str], ...]


def _family(metric: cat.Metric) -> Metric:
    name = metric.name[: -len("_total")] if metric.kind is Kind.COUNTER else metric.name
    return Metric(name, metric.help, metric.kind.value)


_LABEL_SETS_MAX = 1 << 18


class LabelSets:
    """Interned label dicts, one per distinct label set, kept across scrapes.

    The series of a pod barely change between scrapes, so reusing the same dict objects lets
    ``exposition.TextRenderer`` render each label set's text once, not once per scrape.
    """

    def __init__(self) -> None:
        self._sets: dict[_Items, dict[str, str]] = {}
        self._buckets: dict[tuple[_Items, tuple[float, ...]], list[dict[str, str]]] = {}
        self._rank_sets: dict[tuple[tuple[_Items, ...], _Items], list[dict[str, str]]] = {}

    def get(self, items: _Items) -> dict[str, str]:
        labels = self._sets.get(items)
        if labels is None:
            if len(self._sets) > _LABEL_SETS_MAX:
                self._sets.clear()
            labels = self._sets[items] = dict(items)
        return labels

    def ranks(self, rank_items: tuple[_Items, ...], extra: _Items) -> list[dict[str, str]]:
        """The label sets of one per-rank series each: ``rank_items[i] + extra``."""
        key = (rank_items, extra)
        sets = self._rank_sets.get(key)
        if sets is None:
            if len(self._rank_sets) > _LABEL_SETS_MAX:
                self._rank_sets.clear()
            sets = self._rank_sets[key] = [self.get(items + extra) for items in rank_items]
        return sets

    def buckets(self, items: _Items, bounds: tuple[float, ...]) -> list[dict[str, str]]:
        """The ``le`` label sets of a histogram's buckets, ``+Inf`` last."""
        key = (items, bounds)
        sets = self._buckets.get(key)
        if sets is None:
            if len(self._buckets) > _LABEL_SETS_MAX:
                self._buckets.clear()
            sets = self._buckets[key] = [self.get(items + (("le", floatToGoString(b)),)) for b in (*bounds, INF)]
        return sets


def _sample(name: str, labels: dict[str, str], value: float) -> Sample:
    """``Sample(name, labels, value)`` without the keyword defaults handling (31k of them per scrape)."""
    return _make_sample((name, labels, value, None, None, None))


_make_sample = Sample._make


def _add_histogram(family: Metric, labels: LabelSets, items: _Items, hist: Histogram,
                   bounds: tuple[float, ...]) -> None:
    """``hist`` at the exported ``bounds`` (a subset of its own: cumulative counts read there), or
    only its sum and count for a summary."""
    name, samples = family.name, family.samples
    if family.type == Kind.HISTOGRAM.value:
        bucket = name + "_bucket"
        at = [hist.bounds.index(b) for b in bounds] + [len(hist.bounds)]
        samples += [_sample(bucket, bucket_labels, hist.counts[i])
                    for bucket_labels, i in zip(labels.buckets(items, bounds), at, strict=True)]
    own = labels.get(items)
    samples.append(_sample(name + "_sum", own, hist.sum))
    samples.append(_sample(name + "_count", own, hist.count))


def _sum_histograms(hists: Sequence[Histogram]) -> Histogram:
    first = hists[0]
    counts = tuple(sum(h.counts[i] for h in hists) for i in range(len(first.counts)))
    return Histogram(first.bounds, counts, sum(h.sum for h in hists), sum(h.count for h in hists))


class SnapshotCollector:
    """Register on an owned ``CollectorRegistry``; ``view`` returns ``None`` until state is loaded."""

    def __init__(self, view: Callable[[], View | None], identity: Identity, *, per_rank: bool = True,
                 max_ranks: int = 64) -> None:
        if max_ranks < 1:
            raise ValueError(f"max_ranks must be >= 1, got {max_ranks}")
        self._view = view
        self._identity = identity
        self._per_rank = per_rank
        self._max_ranks = max_ranks
        self._labels = LabelSets()

    def describe(self) -> list[Metric]:
        return [_family(m) for m in cat.CATALOGUE]

    def collect(self) -> Iterator[Metric]:
        view = self._view()
        if view is None:
            return iter(())
        return iter(families(view, self._identity, per_rank=self._per_rank, max_ranks=self._max_ranks,
                             labels=self._labels))


def families(view: View, identity: Identity, *, per_rank: bool, max_ranks: int,
             labels: LabelSets | None = None) -> list[Metric]:
    """Every catalogue metric for ``view``, in catalogue order."""
    lab = labels or LabelSets()
    snap = view.snapshot
    base: _Items = (("namespace", identity.namespace), ("job_name", identity.job_name or snap.job),
                    ("pod", identity.pod or snap.pod))
    base_labels = lab.get(base)
    ranks = snap.ranks
    split = per_rank and len(ranks) <= max_ranks
    rank_items = tuple(base + (("rank", str(r.rank)),) for r in ranks) if split else (base + (("rank", ALL_RANKS),),)
    out = {m.name: _family(m) for m in cat.CATALOGUE}

    def per_rank_values(metric: cat.Metric, values: Sequence[float | None], extra: _Items = ()) -> None:
        samples, name = out[metric.name].samples, metric.name
        if split:
            samples += [_sample(name, labels,
                                value) for labels, value in zip(lab.ranks(rank_items, extra), values, strict=True)
                        if value is not None]
            return
        known = [v for v in values if v is not None]
        if known:
            agg = _ALL_RANKS_AGGREGATE.get(metric.name, sum)
            samples.append(Sample(name, lab.get(rank_items[0] + extra), agg(known)))

    def single(metric: cat.Metric, value: float | None, extra: _Items = ()) -> None:
        if value is not None:
            out[metric.name].samples.append(Sample(metric.name, lab.get(base + extra) if extra else base_labels, value))

    def field(get: Callable[[RankSnapshot], float | None]) -> list[float | None]:
        return [get(r) for r in ranks]

    per_rank_values(cat.WALL, field(lambda r: r.wall_s))
    for category in cat.SETTLED_CATEGORIES:
        per_rank_values(cat.TIME, [r.seconds.get(category, 0.0) for r in ranks], (("category", category.value),))
    per_rank_values(cat.UNPROTECTED_WORK, field(lambda r: r.unprotected_s))
    if ranks:
        single(cat.WORK_AT_RISK, sum(r.at_risk_s for r in ranks))
    per_rank_values(cat.STEPS, field(lambda r: r.steps))
    single(cat.TRAINING_STEP, max((r.step for r in ranks if r.step is not None), default=None))
    per_rank_values(cat.LAST_STEP_TIMESTAMP, field(lambda r: r.last_step_wall))
    if ranks:
        step_family = out[cat.STEP_DURATION.name]
        if split:
            for items, r in zip(rank_items, ranks, strict=True):
                _add_histogram(step_family, lab, items, r.step_duration, cat.STEP_DURATION.buckets)
        else:
            _add_histogram(step_family, lab, rank_items[0], _sum_histograms([r.step_duration for r in ranks]),
                           cat.STEP_DURATION.buckets)
    single(cat.JOB_START_TIMESTAMP, snap.job_start_wall)
    single(cat.JOB_WORLD_SIZE, snap.world_size)
    single(cat.POD_RANKS, snap.pod_ranks)

    ck = snap.checkpoints
    _add_histogram(out[cat.CKPT_BLOCKING.name], lab, base, ck.blocking, cat.CKPT_BLOCKING.buckets)
    _add_histogram(out[cat.CKPT_BACKGROUND.name], lab, base, ck.background, cat.CKPT_BACKGROUND.buckets)
    single(cat.CKPT_LAST_SUCCESS, ck.last_success_wall)
    single(cat.CKPT_LAST_STEP, ck.last_success_step)
    single(cat.CKPT_FAILURES, ck.failures)
    single(cat.CKPT_IN_FLIGHT, ck.in_flight)
    single(cat.CKPT_BYTES, ck.bytes_total)
    per_rank_values(cat.CKPT_WORKER_UP, field(lambda r: None if r.worker_alive is None else float(r.worker_alive)))

    rs = snap.restarts
    for level, n in rs.counts.items():
        single(cat.RESTARTS, n, (("level", level.value),))
    for level, hist in rs.duration.items():
        _add_histogram(out[cat.RESTART_DURATION.name], lab, base + (("level", level.value),), hist,
                       cat.RESTART_DURATION.buckets)
    for (level, phase), hist in rs.phases.items():
        single(cat.RESTART_PHASE, hist.sum, (("level", level.value), ("phase", phase.value)))
    single(cat.LAUNCHER_RESTARTS_REMAINING, rs.launcher_remaining)

    for name, seconds in sorted(snap.user_spans.items()):
        single(cat.USER_SPAN_TIME, seconds, (("name", name),))
    per_rank_values(cat.GPU_IDLE, field(lambda r: r.gpu_idle_s), (("source", GpuIdleSource.STEP_PHASES.value),))
    if view.gpu_idle_nvml:
        by_rank = dict(zip(sorted(r.rank for r in ranks), (view.gpu_idle_nvml.get(i) for i in range(len(ranks))),
                           strict=True))
        per_rank_values(cat.GPU_IDLE, [by_rank.get(r.rank) for r in ranks], (("source", GpuIdleSource.NVML.value),))

    single(cat.EXPORTER_EVENTS, snap.events_accepted)
    for reason in sorted(set(REJECT_REASONS) | set(view.rejected)):
        single(cat.EXPORTER_REJECTED, view.rejected.get(reason, 0), (("reason", reason),))
    single(cat.EXPORTER_RECORDS_LOST, snap.records_lost)
    single(cat.EXPORTER_LAG, snap.journal_lag_s)
    for (container, reason), n in sorted(view.pod_restarts.items()):
        single(cat.POD_RESTARTS, n, (("container", container), ("reason", reason)))
    return list(out.values())
