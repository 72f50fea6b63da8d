"""The Prometheus view: a prometheus-client custom collector that renders one ``View`` per scrape.

``collect()`` builds fresh metric families from a new view every time and increments nothing;
which series there are, with which labels and values, is ``series.series``' to say (the OTLP
view renders the same), this module only writes them as prometheus-client families: a
histogram's cumulative ``_bucket`` samples at the catalogue's bounds, then ``_sum`` and
``_count`` (a summary's only those two).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.contracts.catalogue import Kind
from nvrx_slo.exporter.engine.snapshot import Histogram
from nvrx_slo.exporter.identity import PodIdentity
from nvrx_slo.exporter.views.series import Labels, LabelSets, exposed_name, series
from nvrx_slo.exporter.views.view import View


def _family(metric: cat.Metric) -> Metric:
    return Metric(exposed_name(metric), metric.help, metric.kind.value)


_make_sample = Sample._make  # ``Sample(...)`` without the keyword defaults handling (31k of them per scrape)


def _add_histogram(family: Metric, labels: LabelSets, own: Labels, hist: Histogram,
                   bounds: tuple[float, ...]) -> None:
    """``hist`` at the exported ``bounds``, or only its sum and count for a summary."""
    name, samples = family.name, family.samples
    if family.type == Kind.HISTOGRAM.value:
        bucket = name + "_bucket"
        samples += [_make_sample((bucket, bucket_labels, n, None, None, None))
                    for bucket_labels, n in zip(labels.buckets(own, bounds), hist.cumulative_at(bounds), strict=True)]
    samples.append(Sample(name + "_sum", own, hist.sum))
    samples.append(Sample(name + "_count", own, hist.count))


class SnapshotCollector:
    """Register on an owned ``CollectorRegistry``; ``view`` returns ``None`` until state is loaded."""

    def __init__(self, view: Callable[[], View | None], identity: PodIdentity, *, per_rank: bool = True,
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


def families(view: View, identity: PodIdentity, *, per_rank: bool, max_ranks: int,
             labels: LabelSets | None = None) -> list[Metric]:
    """Every catalogue metric for ``view``, in catalogue order."""
    lab = labels or LabelSets()
    out = []
    for s in series(view, identity, per_rank=per_rank, max_ranks=max_ranks, labels=lab):
        family = _family(s.metric)
        name = s.metric.name
        family.samples += [_make_sample((name, labels, value, None, None, None)) for labels, value in s.values]
        for own, hist in s.histograms:
            _add_histogram(family, lab, own, hist, s.metric.buckets)
        out.append(family)
    return out
