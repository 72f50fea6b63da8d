"""Every name the generated rules introduce, in one place: recording rules, labels, alert names,
dashboard uids, and the link stamping that gives each alert its runbook and dashboard; and how a
reader (a rule, an alert, a dashboard) reads a recorded series: the evaluations a window holds, the
best idle source a job has, a bucket bound's spellings. The dashboards take names from here, never
from the rule builders.

Recording rules follow Prometheus's ``level:metric:operations`` convention; the level is
``namespace_job_name`` because every SLI is job-level (summed over pods and ranks). The SLO an
SLI series belongs to is its ``slo`` label, so a dashboard draws all four with one query.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.spec import Slo, Spec
from nvrx_slo.alerts.tiles import Agg, Tiled
from nvrx_slo.contracts import catalogue

JOB_LABELS: tuple[str, ...] = catalogue.IDENTITY_LABELS[:2]  # ("namespace", "job_name")
BY_JOB = f"by ({', '.join(JOB_LABELS)})"
BY_POD = f"by ({', '.join(catalogue.IDENTITY_LABELS)})"
ON_JOB = f"on ({', '.join(JOB_LABELS)})"
SLO_LABEL = "slo"
SEVERITY_LABEL = "severity"

_LEVEL = "_".join(JOB_LABELS)


def sli_bad_record(window: int) -> str:
    """Job-level rate of bad seconds (or events) over the shortest window; the period sums it."""
    return f"{_LEVEL}:nvrx_slo_sli_bad:rate{duration.format(window)}"


def sli_total_record(window: int) -> str:
    return f"{_LEVEL}:nvrx_slo_sli_total:rate{duration.format(window)}"


def error_ratio_record(window: int) -> str:
    return f"{_LEVEL}:nvrx_slo_error_ratio:rate{duration.format(window)}"


def burn_rate_record(window: int) -> str:
    return f"{_LEVEL}:nvrx_slo_burn_rate:rate{duration.format(window)}"


ERROR_BUDGET_REMAINING = f"{_LEVEL}:nvrx_slo_error_budget_remaining:ratio"


class Signal(str, Enum):
    """A job-level derived signal (``alerts/signals.py``): the first five are recorded as the job's
    rates over the shortest window (``signal_rate``), the others over the period from those rates
    (``over_period``), which is what the dashboards read."""

    BLOCKING = "checkpoint_blocking_seconds"
    BACKGROUND = "checkpoint_background_seconds"
    RANK_SAVES = "checkpoint_rank_saves"
    RESTARTS = "restarts"
    RESTART_SECONDS = "restart_seconds"
    OVERLAP = "checkpoint_overlap"
    COST = "checkpoint_blocking_seconds_per_save"
    INTERVAL = "checkpoint_interval_seconds"
    MTBF = "mtbf_seconds"
    RESTART_COST = "restart_seconds_per_restart"
    OPTIMAL = "checkpoint_interval_optimal_seconds"
    PREDICTED = "efficiency_predicted"


def _signal_record(signal: Signal, operation: str) -> str:
    return f"{_LEVEL}:nvrx_{signal.value}:{operation}"


def signal_rate(signal: Signal, plan: Plan) -> str:
    """The job's rate of ``signal`` over the shortest window, e.g. ``…:nvrx_restarts:rate5m``."""
    return _signal_record(signal, f"rate{duration.format(plan.base)}")


def over_period(signal: Signal, plan: Plan) -> str:
    """``signal`` over the SLO period, e.g. ``…:nvrx_mtbf_seconds:mean30d``."""
    return _signal_record(signal, f"mean{duration.format(plan.period)}")
# 1 at each evaluation of an SLO's group (label slo): counting its samples over a window counts the
# evaluations in it, whichever way the Prometheus version bounds a range ([a, b] before 3.0, (a, b] since).
# Recorded with the job-level rates (the local tier), so a global ruler counts the evaluations that
# recorded the samples it sums, not its own (whose timestamps do not line up with them).
EVALUATIONS = "global:nvrx_slo_evaluations:one"


def counter(slo: str) -> Tiled:
    """``slo``'s evaluation counter, counted over windows longer than the tile (``alerts/tiles.py``)."""
    return Tiled(f'{EVALUATIONS}{{{SLO_LABEL}="{slo}"}}', Agg.COUNT)


def ranks(slo: str, plan: Plan) -> Tiled:
    """A time SLI's rank count (its total record) as a window's most: what its ratios divide by, and
    the efficiency SLI's error budget in accelerator-hours."""
    return Tiled(f'{sli_total_record(plan.base)}{{{SLO_LABEL}="{slo}"}}', Agg.MAX)


def evaluations(slo: str, window: int, plan: Plan, *, own: bool = False, span: int | None = None,
                settled: bool = False) -> str:
    """The evaluations of ``slo``'s group in ``window`` s, as a scalar: the samples the window holds,
    and never fewer than a full window's (rules younger than the window: the rest counts as 0). The
    most any Prometheus counted: a global ruler holds one counter per Prometheus that records the
    rates (each with its external labels), and ``scalar()`` of more than one is NaN.

    ``span``: the window is one longer than the tile, and the counter is counted over these seconds
    from its tiles (``counter``), as the samples the window divides are summed; ``settled``, as the
    tiles' group last counted them (``Tiled.settled``), for a window over the period.

    ``own``: the window sums what its own group records, this evaluation included. Prometheus runs
    a group's rules in order, so this evaluation's samples are there; vmalert writes what it
    records asynchronously, so the newest sample it reads is an evaluation or two old and a full
    window holds that many fewer. The floor is then a full window's evaluations as of the newest
    counter sample read: Prometheus's floor where that sample is this evaluation's."""
    selector = f'{EVALUATIONS}{{{SLO_LABEL}="{slo}"}}'
    tiled = counter(slo)
    counted = (f"count_over_time({selector}[{duration.format(window)}])" if span is None
               else tiled.settled(span, plan) if settled else tiled.window(span, plan))
    floor = f"{plan.evaluations(window)}"
    if own:
        newest = f"scalar(max(timestamp({selector})) or vector(time()))"
        floor += f" - (time() - {newest}) / {plan.evaluation_interval}"
    return f"scalar(clamp_min(max({counted}), {floor}))"


# Ranks of the job that no pod runs now (a lost node, a pod not scheduled yet), at each evaluation.
ABSENT_RANKS = f"{_LEVEL}:nvrx_absent_ranks:clamp_min"
# Each scrape target's badput rank-seconds by category, its ranks' counters summed: the base the next
# evaluation's increments subtract (each increment is its counters now less this record then).
TARGET_CATEGORY = f"{_LEVEL}_pod_category:nvrx_badput_seconds_total:sum"
# The job's badput rank-seconds since the evaluation before: its targets' increments summed.
BADPUT_INCREASE = f"{_LEVEL}:nvrx_badput_seconds:increase"
# Rank-seconds of a pod's last ``nvrx_work_at_risk_seconds``, once, at the evaluation that sees its
# series gone for the shortest window (a sidecar dies with its pod's node): badput for the job.
VANISHED_AT_RISK = f"{_LEVEL}:nvrx_work_at_risk_seconds:vanished"
# Each rank's mean step time over the shortest window, and that over the job's median rank's: the
# straggler alert reads the skew (a rank, or a pod whose series are summed as rank="all", slow
# against the whole job, whichever pod it is in).
STEP_SKEW = f"{_LEVEL}_pod_rank:nvrx_step_time_skew:ratio"


def step_time_mean_record(window: int) -> str:
    return f"{_LEVEL}_pod_rank:nvrx_step_duration_seconds:mean{duration.format(window)}"
# Share of the job's accelerator time spent idle, one series per source (alerts/idle.py), at each evaluation.
ACCELERATOR_IDLE = f"{_LEVEL}:nvrx_accelerator_idle:ratio"
IDLE_SOURCE_LABEL = catalogue.GPU_IDLE.labels[0]
DCGM = "dcgm"  # NVIDIA's dcgm-exporter
SIDECAR_IDLE_SOURCES = (catalogue.GpuIdleSource.NVML, catalogue.GpuIdleSource.STEP_PHASES)  # best first
IDLE_SOURCES = (DCGM, *(s.value for s in SIDECAR_IDLE_SOURCES))  # best first: readers take the first a job has


def accelerator_idle(window: str, matchers: tuple[str, ...] = ()) -> str:
    """Each job's recorded idle share averaged over ``window``, from the first of ``IDLE_SOURCES`` it has.

    ``or on (job)`` keeps the job's series of the first source that has one, with its ``source``
    label: one value per job, chosen before any threshold (a job DCGM sees busy does not alert on
    its step phases). A source present anywhere in ``window`` stays chosen, so the label does not flap.
    """
    extra = "".join(f", {m}" for m in matchers)
    return f"\nor on ({', '.join(JOB_LABELS)})\n".join(
        f'avg_over_time({ACCELERATOR_IDLE}{{{IDLE_SOURCE_LABEL}="{s}"{extra}}}[{window}])' for s in IDLE_SOURCES
    )


# Share of the job's wall rank-seconds left unattributed over the shortest window, at each evaluation.
UNATTRIBUTED = f"{_LEVEL}:nvrx_unattributed:ratio"
# Each scrape target's wall counter (its ranks' most): which jobs and targets have wall time at all.
TARGET_WALL = f"{_LEVEL}_pod:nvrx_wall_seconds_total:max"


def pod_restarts_record(window: int) -> str:
    """Each pod's restarts per second over ``window``, which the recovery SLI's counts both read."""
    return f"{_LEVEL}_pod:nvrx_restarts:rate{duration.format(window)}"


def wall_rate_record(window: int) -> str:
    """The job's wall rank-seconds per second over ``window``: its rank count, for the alerts group's shares."""
    return f"{_LEVEL}:nvrx_wall_seconds:rate{duration.format(window)}"


def le_regex(bound: float) -> str:
    """Both spellings of a bucket bound as an ``le`` regex: Go's ``10`` and Python client's ``10.0``."""
    spellings = sorted({f"{bound:g}", repr(float(bound))})
    return "|".join(s.replace(".", "\\\\.") for s in spellings)


class Alert(str, Enum):
    """Every alert the rules define; each has ``docs/runbooks/<name>.md`` and a promtool test."""

    EFFICIENCY_BURN = "NvrxEfficiencyBudgetBurn"
    RECOVERY_BURN = "NvrxRecoveryBudgetBurn"
    CHECKPOINT_BLOCKING_BURN = "NvrxCheckpointBlockingBudgetBurn"
    CHECKPOINT_OVERLAP_BURN = "NvrxCheckpointOverlapBudgetBurn"
    TRAINING_STALLED = "NvrxTrainingStalled"
    CHECKPOINT_STALE = "NvrxCheckpointStale"
    CHECKPOINT_WORKER_DEAD = "NvrxCheckpointWorkerDead"
    RESTART_STORM = "NvrxRestartStorm"
    RESTART_BUDGET_LOW = "NvrxRestartBudgetLow"
    EXPORTER_DOWN = "NvrxExporterDown"
    SLI_NO_DATA = "NvrxSLINoData"
    ACCELERATOR_IDLE = "NvrxAcceleratorIdleHigh"
    STRAGGLER = "NvrxStragglerRank"
    UNATTRIBUTED = "NvrxUnattributedTimeHigh"
    JOURNAL_RECORDS_LOST = "NvrxJournalRecordsLost"


BURN_ALERTS: dict[Slo, Alert] = {
    Slo.EFFICIENCY: Alert.EFFICIENCY_BURN,
    Slo.RECOVERY: Alert.RECOVERY_BURN,
    Slo.CHECKPOINT_BLOCKING: Alert.CHECKPOINT_BLOCKING_BURN,
    Slo.CHECKPOINT_OVERLAP: Alert.CHECKPOINT_OVERLAP_BURN,
}


class Dashboard(str, Enum):
    """Stable Grafana uids (dashboards/ builds them); links survive regeneration."""

    OVERVIEW = "nvrx-slo-overview"
    CHECKPOINTING = "nvrx-slo-checkpointing"
    RECOVERY = "nvrx-slo-recovery"
    RANKS = "nvrx-slo-ranks"
    FLEET = "nvrx-slo-fleet"


DASHBOARD_OF: dict[Alert, Dashboard] = {
    Alert.EFFICIENCY_BURN: Dashboard.OVERVIEW,
    Alert.RECOVERY_BURN: Dashboard.RECOVERY,
    Alert.CHECKPOINT_BLOCKING_BURN: Dashboard.CHECKPOINTING,
    Alert.CHECKPOINT_OVERLAP_BURN: Dashboard.CHECKPOINTING,
    Alert.TRAINING_STALLED: Dashboard.OVERVIEW,
    Alert.CHECKPOINT_STALE: Dashboard.CHECKPOINTING,
    Alert.CHECKPOINT_WORKER_DEAD: Dashboard.CHECKPOINTING,
    Alert.RESTART_STORM: Dashboard.RECOVERY,
    Alert.RESTART_BUDGET_LOW: Dashboard.RECOVERY,
    Alert.EXPORTER_DOWN: Dashboard.OVERVIEW,
    Alert.SLI_NO_DATA: Dashboard.OVERVIEW,
    Alert.ACCELERATOR_IDLE: Dashboard.RANKS,
    Alert.STRAGGLER: Dashboard.RANKS,
    Alert.UNATTRIBUTED: Dashboard.OVERVIEW,
    Alert.JOURNAL_RECORDS_LOST: Dashboard.OVERVIEW,
}

# The dashboards' template variables (dashboards/queries.py: VAR_NAMESPACE, VAR_JOB).
_DASHBOARD_QUERY = "?var-namespace={{ $labels.namespace }}&var-job={{ $labels.job_name }}"


def stamp_links(rule: dict[str, Any], spec: Spec) -> dict[str, Any]:
    """Add ``runbook_url`` and ``dashboard_url`` to an alerting rule's annotations, from one pattern each."""
    alert = Alert(rule["alert"])
    annotations = dict(rule["annotations"])
    annotations["runbook_url"] = spec.runbook_url.replace("{alert}", alert.value)
    annotations["dashboard_url"] = f"{spec.grafana_url}/d/{DASHBOARD_OF[alert].value}{_DASHBOARD_QUERY}"
    return {**rule, "annotations": annotations}


# --- What badput costs (alerts/cost.py): accelerator-hours and money, per job, category and cause ---
CATEGORY_LABEL = catalogue.TIME.labels[0]
CAUSE_LABEL = catalogue.FAULT_TIME.labels[0]
ACCELERATOR_LABEL = catalogue.RANK_ACCELERATORS.labels[0]
PRICE_SOURCE_LABEL = "price_source"


class PriceSource(str, Enum):
    """Which price a cost series was priced by (its ``price_source`` label)."""

    OPENCOST = "opencost"  # OpenCost's node_gpu_hourly_cost of the pod's node
    SPEC = "spec"  # the SLO spec's cost section: the pod's accelerator model, else its default


# Each scrape target's accelerators per rank (label ``accelerator``: the model); the job's most
# accelerators per rank and rank-hour price (label ``price_source``): what its absent ranks cost.
TARGET_ACCELERATORS = f"{_LEVEL}_pod:nvrx_rank_accelerators:last"
JOB_ACCELERATORS = f"{_LEVEL}:nvrx_rank_accelerators:max"
JOB_RANK_PRICE = f"{_LEVEL}:nvrx_rank_price:hourly"
# Each target's fault seconds by cause (newest samples).
TARGET_CAUSE = f"{_LEVEL}_pod_cause:nvrx_fault_seconds_total:last"


class CostOf(str, Enum):
    """What a cost series counts: badput by category (every badput second, absent ones included)
    or by the cause of the fault that cost it (lost, restart and absent seconds only)."""

    CATEGORY = "category"
    CAUSE = "cause"


_COST_METRIC = {CostOf.CATEGORY: "nvrx_badput", CostOf.CAUSE: "nvrx_fault"}


def cost_increase(of: CostOf, money: bool) -> str:
    """The job's badput accelerator-seconds (or money) since the evaluation before, by ``of`` (a
    label of that name: ``nvrx_badput_…`` by category, ``nvrx_fault_…`` by cause)."""
    what = "cost" if money else "accelerator_seconds"
    return f"{_LEVEL}:{_COST_METRIC[of]}_{what}:increase"


def cost_over(of: CostOf, money: bool, window: int) -> str:
    """The job's badput accelerator-hours (or money) over ``window``, by ``of``."""
    what = "cost" if money else "accelerator_hours"
    return f"{_LEVEL}:{_COST_METRIC[of]}_{what}:sum{duration.format(window)}"


# The efficiency SLO's error budget over the period in accelerator-hours and money, and how much of it
# the period's badput spent (the cost records summed over categories).
BUDGET_ACCELERATOR_HOURS = f"{_LEVEL}:nvrx_slo_error_budget_accelerator_hours:period"
BUDGET_COST = f"{_LEVEL}:nvrx_slo_error_budget_cost:period"
SPENT_ACCELERATOR_HOURS = f"{_LEVEL}:nvrx_slo_error_budget_spent_accelerator_hours:period"
SPENT_COST = f"{_LEVEL}:nvrx_slo_error_budget_spent_cost:period"


def cost_records(plan: Plan) -> dict[str, tuple[str, ...]]:
    """Every job-level cost record -> the labels it has beyond the job's (and ``slo``)."""
    out: dict[str, tuple[str, ...]] = {}
    for of, label in ((CostOf.CATEGORY, CATEGORY_LABEL), (CostOf.CAUSE, CAUSE_LABEL)):
        for money in (False, True):
            labels = (label, PRICE_SOURCE_LABEL) if money else (label,)
            out[cost_increase(of, money)] = labels
            out.update({cost_over(of, money, w): labels for w in plan.windows})
    out.update(dict.fromkeys((BUDGET_COST, SPENT_COST, JOB_RANK_PRICE), (PRICE_SOURCE_LABEL,)))
    return out
