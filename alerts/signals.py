"""Job-level derived signals, recorded from the pods' counters: checkpoint overlap, blocking cost
per save, MTBF, the checkpoint interval and Young/Daly's optimum, restart cost, and the efficiency
the ETTR model predicts (``exporter/engine/derived.py`` has the same formulas for one pod's views).

A pod's ratio gauge cannot be added up across pods, and it dies with its pod. So the group records
the job's rates over the shortest window at every evaluation (one series per job), and each signal
sums those over the SLO period: a pod that died has left its share in the job's recorded history,
and "since the job started" is as long as the period (or the rules' history, if shorter).

Counting, as the SLIs do: checkpoint seconds and saves per rank-save, summed over the job's ranks
(a save's blocking cost is the mean over its ranks); faults and restart seconds as the pod that
counted most saw them (every pod of a job in lock step records each fault); the job's elapsed time
is its evaluations (those with checkpoint series) times the evaluation interval; saves per job are
rank-saves over the job's world size.
"""

from __future__ import annotations

from typing import Any

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.conventions import SLO_LABEL, signal_record, sli_total_record
from nvrx_slo.alerts.sli import busiest_pod_rate, job_rate
from nvrx_slo.alerts.spec import Slo, Spec
from nvrx_slo.alerts.tiers import Group, Tier, tiered
from nvrx_slo.alerts.windows import all_windows
from nvrx_slo.contracts import catalogue as cat

Rule = dict[str, Any]

# per evaluation: the job's rates over the shortest window
BLOCKING, BACKGROUND = "checkpoint_blocking_seconds", "checkpoint_background_seconds"
RANK_SAVES = "checkpoint_rank_saves"
RESTARTS, RESTART_SECONDS = "restarts", "restart_seconds"
# over the period
OVERLAP, COST, INTERVAL = "checkpoint_overlap", "checkpoint_blocking_seconds_per_save", "checkpoint_interval_seconds"
MTBF, RESTART_COST = "mtbf_seconds", "restart_seconds_per_restart"
OPTIMAL, PREDICTED = "checkpoint_interval_optimal_seconds", "efficiency_predicted"


def period_text(spec: Spec) -> str:
    """What the period-long signals cover, in words (dashboard descriptions)."""
    return f"the SLO period ({duration.format(spec.period)}, or as long as the rules have run)"


def over_period(spec: Spec, metric: str) -> str:
    """The recorded name of a period-long signal (``MTBF``, ``OVERLAP``, …): what the dashboards read."""
    return signal_record(metric, f"mean{duration.format(spec.period)}")


def records(spec: Spec) -> list[tuple[Tier, Rule]]:
    """The rules, in evaluation order (each reads the ones before it at this evaluation): the rates
    read the pods' series (``Tier.LOCAL``), the period's signals only those rates (``Tier.GLOBAL``)."""
    base, period = all_windows(spec.period, spec.min_window)[0], spec.period
    w, p, every = duration.format(base), duration.format(period), spec.evaluation_interval
    world = f'{sli_total_record(base)}{{{SLO_LABEL}="{Slo.EFFICIENCY.value}"}}'  # the job's rank count

    def rate(name: str) -> str:
        return signal_record(name, f"rate{w}")

    def over(name: str) -> str:
        return over_period(spec, name)

    def total(name: str) -> str:
        return f"sum_over_time({rate(name)}[{p}])"

    elapsed = f"count_over_time({rate(BLOCKING)}[{p}])"  # evaluations: × interval = seconds
    restart_seconds = f"{cat.RESTART_DURATION.name}_sum"
    rates = [
        (rate(BLOCKING), job_rate(f"{cat.CKPT_BLOCKING.name}_sum", w)),
        (rate(BACKGROUND), job_rate(f"{cat.CKPT_BACKGROUND.name}_sum", w)),
        (rate(RANK_SAVES), job_rate(f"{cat.CKPT_BLOCKING.name}_count", w)),
        (rate(RESTARTS), busiest_pod_rate(f"{cat.RESTART_DURATION.name}_count", w)),
        (rate(RESTART_SECONDS), busiest_pod_rate(restart_seconds, w)),
    ]
    signals = [
        (over(OVERLAP), f"{total(BACKGROUND)}\n/\n(({total(BLOCKING)} + {total(BACKGROUND)}) > 0)"),
        (over(COST), f"{total(BLOCKING)}\n/\n({total(RANK_SAVES)} > 0)"),
        (over(INTERVAL), f"{elapsed} * {every}\n/\n"
                         f"({total(RANK_SAVES)} * {every} / ignoring ({SLO_LABEL}) max_over_time({world}[{p}]) > 0)"),
        (over(MTBF), f"{elapsed}\n/\n({total(RESTARTS)} > 0)"),
        (over(RESTART_COST), f"{total(RESTART_SECONDS)}\n/\n({total(RESTARTS)} > 0)"),
        (over(OPTIMAL), f"sqrt(2 * {over(COST)} * {over(MTBF)})"),
        # ETTR ≈ (1 − (u₀ + Δt/2) / MTBF) / (1 + C/Δt); no fault yet: the checkpoint term alone
        (over(PREDICTED), f"clamp(\n  (1 - ((({over(RESTART_COST)} or 0 * {over(INTERVAL)}) + {over(INTERVAL)} / 2)"
                          f" / {over(MTBF)}\n        or 0 * {over(INTERVAL)}))\n"
                          f"  / (1 + {over(COST)} / {over(INTERVAL)}),\n  0, 1)"),
    ]
    return [*tiered(Tier.LOCAL, ({"record": name, "expr": expr} for name, expr in rates)),
            *tiered(Tier.GLOBAL, ({"record": name, "expr": expr} for name, expr in signals))]


def signals_group(spec: Spec) -> Group:
    return Group("nvrx-slo-signals", spec.evaluation_interval, tuple(records(spec)))
