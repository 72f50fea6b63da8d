"""PromQL building blocks for the dashboards: selectors bound to the template variables, and the SLO arithmetic.

Every metric name and label comes from ``nvrx_slo.contracts.catalogue``; nothing here spells one by hand,
so a renamed metric fails generation (and the tests), not a dashboard in production.

The queries read the exporter's raw series, so the dashboards work before (or without) the
generated alert rules, with one exception: burn rates and the error budget read the recording
rules the alerts fire on (``slo_record``), so a panel shows the number an alert fired on rather
than a re-derivation that could drift from ``alerts/rules.py``. Aggregation, as the catalogue
prescribes: time is in rank-seconds, so ``sum(productive) / sum(wall)`` over a job is the
rank-average efficiency of the ranks its pods report; ranks no pod ran (a lost node's, a pod not
scheduled yet) are in no pod's series, and only the efficiency SLI's records (``slo_record``) count
them. Per-pod gauges (checkpoint age, MTBF, …) are shown per pod.

Two time bases appear, and each panel says which one it uses:
* **since job start** — the sidecar's counters are job-lifetime totals rebuilt from the
  journal (they survive sidecar restarts), so a plain ``sum()`` of them is exact, with no rate
  window and no first-scrape loss;
* **over a window** — ``rate()``/``increase()`` over ``$__rate_interval`` or an SLO window.
"""

from __future__ import annotations

from enum import Enum

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.conventions import SEVERITY_LABEL, SLO_LABEL
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.spec import Slo
from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.contracts.catalogue import Metric

# Template variables (dashboard variable name -> the label it filters, and how).
VAR_DATASOURCE = "datasource"
VAR_NAMESPACE = "namespace"
VAR_JOB = "job"
VAR_POD = "pod"
NAMESPACE_LABEL, JOB_LABEL, POD_LABEL = cat.IDENTITY_LABELS
IDENTITY_MATCHERS: tuple[tuple[str, str, str], ...] = (
    (NAMESPACE_LABEL, "=", f"${VAR_NAMESPACE}"),
    (JOB_LABEL, "=", f"${VAR_JOB}"),
    (POD_LABEL, "=~", f"${VAR_POD}"),
)
POD_ALL_VALUE = ".+"  # the pod variable's "All": every pod of the selected job
# The selected job, for series recorded per job (the pod variable does not apply to them).
JOB_MATCHERS = (f'{NAMESPACE_LABEL}="${VAR_NAMESPACE}"', f'{JOB_LABEL}="${VAR_JOB}"')

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
LE_LABEL = "le"
# Labels beyond identity, as the catalogue's metrics declare them (series() and the tests check).
RANK_LABEL = cat.RANK_LABEL
CATEGORY_LABEL = "category"
LEVEL_LABEL = "level"
PHASE_LABEL = "phase"
SOURCE_LABEL = "source"

# Prometheus's own series of alert states (not ours; its labels are the alert's labels).
ALERTS = "ALERTS"
ALERT_NAME_LABEL = "alertname"
ALERT_STATE_LABEL = "alertstate"

RATE_INTERVAL = "$__rate_interval"
INTERVAL = "$__interval"


class Regex(str):
    """A matcher value to use as a regular expression (``label=~"..."``)."""


Match = str | Enum | Regex | tuple[str | Enum, ...]


def _value(v: str | Enum) -> str:
    return v.value if isinstance(v, Enum) else v


def series(metric: Metric, suffix: str = "", **match: Match) -> str:
    """``name{identity matchers, extra matchers}`` for one catalogue metric.

    ``suffix`` picks a histogram's ``_bucket``/``_sum``/``_count`` series. A tuple value becomes a
    regex alternation (``label=~"a|b"``), a ``Regex`` a regex as written. Labels the metric does
    not carry are refused here, at generation time.
    """
    suffixes = {cat.Kind.HISTOGRAM: HISTOGRAM_SUFFIXES, cat.Kind.SUMMARY: HISTOGRAM_SUFFIXES[1:]}.get(metric.kind, ())
    if suffix and suffix not in suffixes:
        raise ValueError(f"{metric.name}: suffix {suffix!r} needs a histogram or summary and one of {suffixes}")
    allowed = set(metric.all_labels) | ({LE_LABEL} if suffix == "_bucket" else set())
    unknown = set(match) - allowed
    if unknown:
        raise ValueError(f"{metric.name} has no label(s) {sorted(unknown)}; it has {sorted(allowed)}")
    matchers = [f'{label}{op}"{value}"' for label, op, value in IDENTITY_MATCHERS]
    for label, value in match.items():
        if isinstance(value, tuple):
            matchers.append(f'{label}=~"{"|".join(_value(v) for v in value)}"')
        elif isinstance(value, Regex):
            matchers.append(f'{label}=~"{value}"')
        else:
            matchers.append(f'{label}="{_value(value)}"')
    return f"{metric.name}{suffix}{{{', '.join(matchers)}}}"


def alerts_firing() -> str:
    """Firing alerts of the selected job, one row per alert name and severity."""
    matchers = f'{ALERT_STATE_LABEL}="firing", {NAMESPACE_LABEL}="${VAR_NAMESPACE}", {JOB_LABEL}="${VAR_JOB}"'
    return f"sum by ({ALERT_NAME_LABEL}, {SEVERITY_LABEL}) ({ALERTS}{{{matchers}}})"


def rate(metric: Metric, window: str = RATE_INTERVAL, suffix: str = "", **match: Match) -> str:
    return f"rate({series(metric, suffix, **match)}[{window}])"


def increase(metric: Metric, window: str, suffix: str = "", **match: Match) -> str:
    return f"increase({series(metric, suffix, **match)}[{window}])"


def by(labels: tuple[str, ...] | str, expr: str, op: str = "sum") -> str:
    """``op by (labels) (expr)``; an empty tuple gives a plain ``op(expr)``."""
    labels = (labels,) if isinstance(labels, str) else labels
    return f"{op} by ({', '.join(labels)}) ({expr})" if labels else f"{op}({expr})"


def mean_per_event(metric: Metric, labels: tuple[str, ...] = (), window: str | None = None) -> str:
    """Mean of a histogram's observations: over a window, or since job start when ``window`` is None.

    Only where there were observations: a level that never restarted has no mean, not NaN.
    """
    if window is None:
        total, count = by(labels, series(metric, "_sum")), by(labels, series(metric, "_count"))
    else:
        total, count = by(labels, rate(metric, window, "_sum")), by(labels, rate(metric, window, "_count"))
    return f"{total} / ({count} > 0)"


def quantile(q: float, metric: Metric, labels: tuple[str, ...] = (), window: str | None = None) -> str:
    """``histogram_quantile`` over a window, or over every observation since job start; none without observations."""
    if window is None:
        buckets, count = series(metric, "_bucket"), by(labels, series(metric, "_count"))
    else:
        buckets, count = rate(metric, window, "_bucket"), by(labels, rate(metric, window, "_count"))
    return f"histogram_quantile({q}, {by((*labels, LE_LABEL), buckets)}) and on({', '.join(labels)}) ({count} > 0)"


# --- time accounting -------------------------------------------------------------------------

def category_share(categories: tuple[cat.Category, ...], window: str | None) -> str:
    """Fraction of the job's wall rank-seconds in each category, by category."""
    if window is None:
        part, wall = series(cat.TIME, category=categories), series(cat.WALL)
    else:
        part, wall = rate(cat.TIME, window, category=categories), rate(cat.WALL, window)
    return f"{by(CATEGORY_LABEL, part)} / on() group_left() {by((), wall)}"


def unprotected_share() -> str:
    """The provisional slice (training since the last durable checkpoint) as a fraction of wall."""
    return f"{by((), series(cat.UNPROTECTED_WORK))} / {by((), series(cat.WALL))}"


def efficiency(window: str | None) -> str:
    """productive / wall of the ranks the job's pods report (rank-average): since job start, or over a window.

    Work since the last durable checkpoint is not productive yet, so this dips between saves.
    """
    if window is None:
        return f"{by((), series(cat.TIME, category=cat.Category.PRODUCTIVE))} / {by((), series(cat.WALL))}"
    return f"{by((), rate(cat.TIME, window, category=cat.Category.PRODUCTIVE))} / {by((), rate(cat.WALL, window))}"


def badput_ratio(window: str | None, categories: tuple[cat.Category, ...] = cat.BADPUT_CATEGORIES) -> str:
    """Settled seconds in ``categories`` / wall, since job start or over a window (a category with no
    series yet counts as zero). Unprotected work is not bad until a fault rolls it back; then all of
    it lands in ``lost`` at once."""
    if window is None:
        bad, wall = by((), series(cat.TIME, category=categories)), by((), series(cat.WALL))
    else:
        bad, wall = by((), rate(cat.TIME, window, category=categories)), by((), rate(cat.WALL, window))
    return f"({bad} or 0 * {wall}) / {wall}"


def record(name: str) -> str:
    """A per-pod series of a recording rule the generated alert rules define (e.g. a rank's step-time
    skew), for the selected job and pods; it exists only where the generated rules are installed."""
    matchers = ", ".join(f'{label}{op}"{value}"' for label, op, value in IDENTITY_MATCHERS)
    return f"{name}{{{matchers}}}"


def job_record(name: str) -> str:
    """A job-level series of a recording rule the generated alert rules define (``alerts/signals.py``),
    for the selected job; the pod variable does not apply."""
    return f"{name}{{{', '.join(JOB_MATCHERS)}}}"


def period_text(plan: Plan) -> str:
    """What a period-long signal (``conventions.over_period``) covers, in words, for panel descriptions."""
    return f"the SLO period ({duration.format(plan.period)}, or as long as the rules have run)"


def slo_record(name: str, slo: Slo) -> str:
    """One SLO's series of a recording rule the generated alert rules define, for the selected job.

    ``name`` comes from ``nvrx_slo.alerts.conventions`` (e.g. ``burn_rate_record(3600)``), so a panel shows the
    very number an alert fires on. The rules record per job (namespace, job_name), so the pod
    variable does not apply; the series exist only where the generated rules are installed.
    """
    matchers = ", ".join((f'{SLO_LABEL}="{slo.value}"', *JOB_MATCHERS))
    return f"{name}{{{matchers}}}"


def busiest_pod(expr: str, labels: tuple[str, ...] = ()) -> str:
    """A job's count of events every pod records (restarts: each pod of a job in lock step records
    every fault), as the pod that counted most saw it, by ``labels`` — as the recovery SLI counts."""
    return by(labels, by((POD_LABEL, *labels), expr), "max")


def delta(metric: Metric, labels: tuple[str, ...]) -> str:
    """How much a counter or timestamp rose since the previous step, by ``labels``.

    ``x - x offset $__interval`` at step ``$__interval`` tiles time exactly, so each change
    counts once; ``increase(x[w])`` over overlapping windows would count it several times and
    ``changes(x[w])`` misses a change that falls between two windows. The sidecar's counters
    never go backwards (they are rebuilt from the journal), so no reset handling is needed.
    """
    x = series(metric)
    return by(labels, f"{x} - {x} offset {INTERVAL}")


def restarts_delta() -> str:
    """The job's restarts since the previous step, by level (``delta``, the busiest pod's)."""
    x = series(cat.RESTARTS)
    return busiest_pod(f"{x} - {x} offset {INTERVAL}", (LEVEL_LABEL,))


def moved(metric: Metric, labels: tuple[str, ...]) -> str:
    """Positive where a counter or timestamp rose since the previous step (for annotations)."""
    return f"{delta(metric, labels)} > 0"


# --- what badput cost (alerts/cost.py's records) -----------------------------------------------

NAMESPACE_ALL_VALUE = ".*"  # the fleet's namespace "All": every namespace, a namespace-less demo's too
FLEET_MATCHERS = (f'{NAMESPACE_LABEL}=~"${VAR_NAMESPACE}"',)


def over_range(record: str, labels: tuple[str, ...], matchers: tuple[str, ...] = JOB_MATCHERS,
               per: float = 1.0) -> str:
    """A recorded per-evaluation increment (``conventions.cost_increase``) summed over the dashboard's
    time range, by ``labels``: every evaluation once, however long the range (the recorded SLO
    windows past an hour lag by up to an hour; this does not)."""
    total = by(labels, f"sum_over_time({record}{{{', '.join(matchers)}}}[$__range])")
    return total if per == 1.0 else f"{total} / {per:g}"


def per_interval(record: str, labels: tuple[str, ...], matchers: tuple[str, ...] = JOB_MATCHERS,
                 per: float = 1.0) -> str:
    """A recorded per-evaluation increment summed over each step (``$__interval``), by ``labels``."""
    total = by(labels, f"sum_over_time({record}{{{', '.join(matchers)}}}[{INTERVAL}])")
    return total if per == 1.0 else f"{total} / {per:g}"


def fleet_record(name: str, **match: str) -> str:
    """A job-level recorded series of every job in the selected namespace(s)."""
    matchers = ", ".join((*FLEET_MATCHERS, *(f'{label}="{value}"' for label, value in match.items())))
    return f"{name}{{{matchers}}}"
