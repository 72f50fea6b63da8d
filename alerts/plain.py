"""Plain alerts: conditions a burn rate would see late or not at all (a hang, a dead worker, a
blind spot), each from the catalogue's series, with thresholds from the spec.

Silence where a job has not started yet is deliberate: "no step since …" and "no checkpoint
since …" fall back to the job's start time, so a job hung in init, or one that never manages a
first save, is caught too.
"""

from __future__ import annotations

import textwrap
from typing import Any

from nvrx_slo.alerts import duration, idle
from nvrx_slo.alerts.conventions import (
    BY_JOB,
    BY_POD,
    ON_JOB,
    SEVERITY_LABEL,
    STEP_SKEW,
    TARGET_WALL,
    UNATTRIBUTED,
    Alert,
    accelerator_idle,
    stamp_links,
    step_time_mean_record,
    wall_rate_record,
)
from nvrx_slo.alerts.plan import Plan, Severity
from nvrx_slo.alerts.sli import job_rate, share_of_wall
from nvrx_slo.alerts.spec import PlainAlerts, Spec
from nvrx_slo.alerts.tiers import Group, Tier, tiered
from nvrx_slo.contracts import catalogue as cat

Rule = dict[str, Any]

JOB = "{{ $labels.namespace }}/{{ $labels.job_name }}"
POD_RANK = JOB + " pod {{ $labels.pod }} rank {{ $labels.rank }}"
BY_RANK = f"by ({', '.join(cat.IDENTITY_LABELS + (cat.RANK_LABEL,))})"
SCRAPE_TARGET = "on (job, instance)"  # the labels Prometheus gives every series of one scrape
RECORDS_LOST_WITHIN = 15 * 60  # any loss is worth a ticket: a condition, not a tunable quantity


def _alert(alert: Alert, expr: str, for_: int, severity: Severity, summary: str, description: str) -> Rule:
    rule: Rule = {"alert": alert.value, "expr": expr}
    if for_:
        rule["for"] = duration.format(for_)
    rule["labels"] = {SEVERITY_LABEL: severity.value}
    rule["annotations"] = {"summary": summary, "description": description}
    return rule


def _since(metric: cat.Metric) -> str:
    """Seconds since ``metric``'s timestamp, or since the job started if it has none yet."""
    return (
        f"time() - (max {BY_JOB} ({metric.name})\n"
        f"  or min {BY_JOB} ({cat.JOB_START_TIMESTAMP.name}))"
    )


def _training_alerts(a: PlainAlerts) -> list[Rule]:
    """What the training loop itself is doing wrong: not stepping, not saving, restarting."""
    return [
        _alert(
            Alert.TRAINING_STALLED, f"{_since(cat.LAST_STEP_TIMESTAMP)}\n> {a.stalled_after}", 0, Severity.PAGE,
            "A training job has made no step progress.",
            f"{JOB} has completed no training step for {{{{ $value | humanizeDuration }}}} "
            f"(alerts after {duration.format(a.stalled_after)}).",
        ),
        _alert(
            Alert.CHECKPOINT_STALE, f"{_since(cat.CKPT_LAST_SUCCESS)}\n> {a.checkpoint_stale_after}", 0,
            Severity.TICKET,
            "A training job has no recent durable checkpoint.",
            f"{JOB}'s latest durable checkpoint is {{{{ $value | humanizeDuration }}}} old "
            f"(alerts after {duration.format(a.checkpoint_stale_after)}); a fault now loses all work since.",
        ),
        _alert(
            Alert.CHECKPOINT_WORKER_DEAD, f"min {BY_RANK} ({cat.CKPT_WORKER_UP.name}) == 0", a.worker_dead_for,
            Severity.PAGE,
            "NVRx's async checkpoint worker is dead.",
            f"{POD_RANK}: the persistent async checkpoint worker is dead; no save becomes durable, and a loop "
            "waiting on the next save with NVRx's own calls waits forever.",
        ),
        _alert(
            Alert.RESTART_STORM,
            # each pod counts every fault of a job in lock step: the pod that counted most, not their sum
            f"max {BY_JOB} (sum {BY_POD} (increase({cat.RESTARTS.name}[{duration.format(a.restart_storm_within)}])))\n"
            f">= {a.restart_storm_restarts}",
            0, Severity.TICKET,
            "A training job is restarting over and over.",
            f"{JOB} restarted {{{{ $value | printf \"%.0f\" }}}} times in the last "
            f"{duration.format(a.restart_storm_within)} (alerts at {a.restart_storm_restarts}).",
        ),
        _alert(
            Alert.RESTART_BUDGET_LOW,
            f"min {BY_POD} ({cat.LAUNCHER_RESTARTS_REMAINING.name}) <= {a.restart_budget_remaining}",
            0, Severity.TICKET,
            "ft_launcher is about to run out of restarts.",
            f"{JOB} pod {{{{ $labels.pod }}}}: ft_launcher has {{{{ $value }}}} restarts left (--max-restarts); "
            "one more fault than that and the job fails.",
        ),
    ]


def _measurement_alerts(a: PlainAlerts, plan: Plan) -> list[Rule]:
    """What the measurements say beyond the SLOs, and where they themselves fail."""
    up = f'up{{job=~"{a.exporter_scrape_job}"}}'
    return [
        _alert(
            Alert.EXPORTER_DOWN, f"{up} == 0", a.exporter_down_for, Severity.TICKET,
            "Prometheus cannot scrape an nvrx-slo sidecar.",
            "Scrape target {{ $labels.instance }} ({{ $labels.job }}) is down: its job's SLIs are not being measured.",
        ),
        _alert(
            Alert.SLI_NO_DATA,
            f"(max {BY_JOB} ({TARGET_WALL})\n"
            f"  unless {ON_JOB} ({wall_rate_record(plan.base)} > 0))\n"
            f"or\n({up} == 1\n  unless {SCRAPE_TARGET} {TARGET_WALL})",
            a.no_data_for, Severity.TICKET,
            "An nvrx-slo sidecar is up but its SLIs have no data.",
            "{{ with $labels.job_name }}Job {{ $labels.namespace }}/{{ . }} reports wall time that has stopped "
            "advancing, so its SLIs have no value (is the sidecar stuck?){{ else }}Target {{ $labels.instance }} is "
            "scraped but reports no wall time (is the trainer writing its journal where the sidecar reads?){{ end }}.",
        ),
        _alert(
            Alert.ACCELERATOR_IDLE,
            f"(\n{textwrap.indent(accelerator_idle(duration.format(a.idle_over)), '  ')}\n)\n> {a.idle_ratio:g}",
            a.idle_for, Severity.TICKET,
            "A training job's accelerators are idle much of the time.",
            f"{JOB}: accelerators idle {{{{ $value | humanizePercentage }}}} of wall time over the last "
            f"{duration.format(a.idle_over)} (source {{{{ $labels.source }}}}; alerts above {a.idle_ratio:.0%}).",
        ),
        _alert(
            Alert.STRAGGLER, f"{STEP_SKEW}\n> {a.straggler_skew:g}",
            a.straggler_for, Severity.TICKET,
            "A rank is slower than its peers.",
            f"{POD_RANK} takes {{{{ printf \"%.2f\" $value }}}}× the step time of the job's median rank "
            f"(alerts above {a.straggler_skew:g}×); in lock step the whole job runs at its pace.",
        ),
        _alert(
            Alert.UNATTRIBUTED,
            f"avg_over_time({UNATTRIBUTED}[{duration.format(a.unattributed_over)}])\n> {a.unattributed_ratio:g}",
            a.unattributed_for, Severity.TICKET,
            "Time nvrx-slo cannot attribute is growing.",
            f"{JOB}: {{{{ $value | humanizePercentage }}}} of wall time over the last "
            f"{duration.format(a.unattributed_over)} is unattributed (alerts above {a.unattributed_ratio:.0%}).",
        ),
        _alert(
            Alert.JOURNAL_RECORDS_LOST,
            f"sum {BY_POD} (increase({cat.EXPORTER_RECORDS_LOST.name}[{duration.format(RECORDS_LOST_WITHIN)}]))\n> 0",
            0, Severity.TICKET,
            "An nvrx-slo sidecar lost journal records before reading them.",
            f"{JOB} pod {{{{ $labels.pod }}}}: {{{{ $value | printf \"%.0f\" }}}} journal records were never read in "
            f"the last {duration.format(RECORDS_LOST_WITHIN)} (rotated away before the sidecar got to them); "
            "its accounting misses them.",
        ),
    ]


def plain_alerts(spec: Spec, plan: Plan) -> list[Rule]:
    rules = [*_training_alerts(spec.alerts), *_measurement_alerts(spec.alerts, plan)]
    return [stamp_links(rule, spec) for rule in rules]


def wall_records(plan: Plan) -> list[Rule]:
    """The pods' wall counters, read twice, not once per rule: each target's (which jobs and targets
    have wall time, for the no-data alert) and the job's rate over the shortest window, which every
    share of wall in the group divides by; then the share left unattributed, which its alert
    averages over its own window as the idle alert does (no window re-reads per-rank series)."""
    base = plan.base
    unattributed = f'{cat.TIME.name}{{category="{cat.Category.UNATTRIBUTED.value}"}}'
    return [{"record": TARGET_WALL, "expr": f"max without ({cat.RANK_LABEL}) ({cat.WALL.name})"},
            {"record": wall_rate_record(base), "expr": job_rate(cat.WALL.name, duration.format(base))},
            {"record": UNATTRIBUTED, "expr": share_of_wall(unattributed, base)}]


def straggler_records(plan: Plan) -> list[Rule]:
    """Each rank's mean step time over the shortest window (a pod without per-rank series: its
    ranks' mean, as rank="all"), then its skew against the job's median across every pod's ranks."""
    w, record, steps = duration.format(plan.base), step_time_mean_record(plan.base), cat.STEP_DURATION.name
    mean = (f"sum {BY_RANK} (rate({steps}_sum[{w}]))\n"
            f"/\n(sum {BY_RANK} (rate({steps}_count[{w}])) > 0)")
    skew = f"{record}\n/ {ON_JOB} group_left ()\n(quantile {BY_JOB} (0.5, {record}) > 0)"
    return [{"record": record, "expr": mean}, {"record": STEP_SKEW, "expr": skew}]


def plain_group(spec: Spec, plan: Plan) -> Group:
    """The records the alerts read come first: a group evaluates in order, so they read this evaluation's.
    All of it is ``Tier.LOCAL``: each alert reads the pods' series, or records of them over windows no
    longer than a local Prometheus keeps anyway, and fires from the Prometheus that scrapes the job."""
    rules = wall_records(plan) + idle.records(plan) + straggler_records(plan) + plain_alerts(spec, plan)
    return Group("nvrx-slo-alerts", plan.evaluation_interval, tuple(tiered(Tier.LOCAL, rules)))
