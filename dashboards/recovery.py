"""Recovery: how often the job fails, how long each level of restart takes and where that time
goes (phases), and whether the checkpoint interval suits the failure rate (Young/Daly, ETTR)."""

from __future__ import annotations

from grafanalib import core as g

from nvrx_slo.alerts.conventions import Dashboard, Signal, le_regex, over_period
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.spec import Slo, Spec
from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.dashboards import panels as p
from nvrx_slo.dashboards import queries as q

UID = Dashboard.RECOVERY.value  # stable: the alerts link to it

_LEVEL = (q.LEVEL_LABEL,)
_PHASE = (q.LEVEL_LABEL, q.PHASE_LABEL)


def _within(threshold_s: float) -> str:
    """Share of the job's restarts since its start back within ``threshold_s`` (a bucket bound, in
    either spelling), as the recovery SLI counts them: a restart is slow if any pod's share of it
    was, each counted as the pod that counted most saw it."""
    fast = q.series(cat.RESTART_DURATION, "_bucket", le=q.Regex(le_regex(threshold_s)))
    count = q.series(cat.RESTART_DURATION, "_count")
    slow = q.by((), f"{q.by(q.POD_LABEL, count)} - {q.by(q.POD_LABEL, fast)}", "max")
    return f"1 - {slow} / ({q.busiest_pod(count)} > 0)"


def _summary(spec: Spec, plan: Plan) -> list[object]:
    recovery, efficiency = spec.objectives[Slo.RECOVERY], spec.objectives[Slo.EFFICIENCY]
    slo_s = f"{spec.recovery_threshold:g} s"
    return [
        p.stat("Restarts since job start", "Restarts by level: inprocess (NVRx Wrapper), injob (ft_launcher), pod.",
               [p.Query(q.busiest_pod(q.series(cat.RESTARTS), _LEVEL), "{{level}}")], p.COUNT, w=4),
        p.stat(f"Restarts back within {slo_s}", f"Share of restarts (all levels) from fault to the first step of "
               f"the restarted loop within {slo_s}, since job start. Objective {recovery.target:.0%}.",
               [p.Query(_within(spec.recovery_threshold))], p.RATIO, steps=((None, p.RED), (recovery.target, p.GREEN)),
               decimals=1, w=4),
        p.stat("Mean restart latency", "Mean seconds from fault to the first step of the restarted loop (restore "
               "included), by level, since job start.",
               [p.Query(q.mean_per_event(cat.RESTART_DURATION, _LEVEL), "{{level}}")], p.SECONDS,
               steps=((None, p.GREEN), (spec.recovery_threshold, p.RED)), w=4),
        p.stat("Restarts left (ft_launcher)", "Restarts ft_launcher may still make before the job fails "
               "(--max-restarts minus restarts so far), per pod. Red at the restart-budget-low alert's "
               f"{spec.alerts.restart_budget_remaining}.",
               [p.Query(q.series(cat.LAUNCHER_RESTARTS_REMAINING), "{{pod}}")], p.COUNT,
               steps=((None, p.RED), (spec.alerts.restart_budget_remaining + 1.0, p.GREEN)), w=4),
        p.stat("MTBF", f"Mean wall time between the job's faults over {q.period_text(plan)} (each fault once).",
               [p.Query(q.job_record(over_period(Signal.MTBF, plan)))], p.SECONDS, w=4),
        p.stat("Predicted efficiency", "Efficiency the ETTR model predicts from the job's measured MTBF, restart "
               f"and checkpoint costs over {q.period_text(plan)}. Compare with the measured efficiency below.",
               [p.Query(q.job_record(over_period(Signal.PREDICTED, plan)))], p.RATIO,
               steps=((None, p.RED), (efficiency.target, p.GREEN)), decimals=2, w=4),
    ]


def _detail(spec: Spec, plan: Plan) -> list[object]:
    efficiency = spec.objectives[Slo.EFFICIENCY]
    slo_s = f"{spec.recovery_threshold:g} s"
    return [
        p.timeseries("Restart latency by level", f"Mean and p99 seconds from fault to the restarted loop's first "
                     f"step, per level, over every restart since job start (steps up at each restart). Dashed: "
                     f"the {slo_s} objective.",
                     [p.Query(q.mean_per_event(cat.RESTART_DURATION, _LEVEL), "{{level}} mean"),
                      p.Query(q.quantile(0.99, cat.RESTART_DURATION, _LEVEL), "{{level}} p99")],
                     p.SECONDS, steps=((None, p.GREEN), (spec.recovery_threshold, p.RED))),
        p.timeseries("Restart latency by phase", "Mean seconds per restart in each phase (detect, teardown, "
                     "rendezvous, reinit, restore), per level, over every restart since job start: where a restart "
                     "spends its time (a level's phases add up to its mean restart latency).",
                     [p.Query(f"{q.by(_PHASE, q.series(cat.RESTART_PHASE))}\n/ ignoring ({q.PHASE_LABEL}) group_left ()"
                              f"\n({q.by(_LEVEL, q.series(cat.RESTARTS))} > 0)", "{{level}} {{phase}}")], p.SECONDS),
        p.timeseries("Restarts over time", "Restarts per dashboard interval, by level.",
                     [p.Query(q.restarts_delta(), "{{level}}")], p.COUNT, bars=True, w=8),
        p.timeseries("Checkpoint interval: optimal vs actual", "The job's mean time between saves vs the "
                     f"Young/Daly optimum √(2 · blocking cost · MTBF), over {q.period_text(plan)}. Far above "
                     "the optimum: a fault loses more work than needed; far below: saves cost more than they protect.",
                     [p.Query(q.job_record(over_period(Signal.INTERVAL, plan)), "actual"),
                      p.Query(q.job_record(over_period(Signal.OPTIMAL, plan)), "optimal")], p.SECONDS, w=8),
        p.timeseries("Efficiency: predicted vs measured", "ETTR-model prediction for the job against the measured "
                     f"productive / wall since job start. Dashed: the {efficiency.target:.0%} objective.",
                     [p.Query(q.job_record(over_period(Signal.PREDICTED, plan)), "predicted"),
                      p.Query(q.efficiency(None), "measured")],
                     p.RATIO, steps=((None, p.RED), (efficiency.target, p.GREEN)), w=8),
        p.timeseries("MTBF", f"Mean wall time between the job's faults over {q.period_text(plan)} "
                     "(each fault once).",
                     [p.Query(q.job_record(over_period(Signal.MTBF, plan)), "job")], p.SECONDS, w=12),
        p.timeseries("Restart and restore share of wall", "Rank-seconds spent restarting and restoring, and work "
                     "lost to rollbacks, as shares of wall over the rate window.",
                     [p.Query(q.category_share((cat.Category.RESTART, cat.Category.CHECKPOINT_RESTORE,
                                                cat.Category.LOST), q.RATE_INTERVAL), "{{category}}")],
                     p.RATIO, stack=True, w=12),
    ]


def dashboard(spec: Spec, plan: Plan) -> g.Dashboard:
    return p.dashboard(
        uid=UID, title="nvrx-slo / Recovery", module="recovery",
        description=f"Faults and restarts for one job: {spec.objectives[Slo.RECOVERY].target:.0%} of restarts back "
                    f"to training within {spec.recovery_threshold:g} s.",
        panels=[p.row("Since job start"), *_summary(spec, plan),
                p.row("Latency, frequency and the checkpoint interval"), *_detail(spec, plan)],
    )
