"""SLO overview: the page an on-call engineer opens first — efficiency against its objective,
the error budget and how fast it burns, where the badput went, and what is firing."""

from __future__ import annotations

from grafanalib import core as g

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.conventions import (
    BUDGET_ACCELERATOR_HOURS,
    BUDGET_COST,
    CAUSE_LABEL,
    ERROR_BUDGET_REMAINING,
    PRICE_SOURCE_LABEL,
    SPENT_ACCELERATOR_HOURS,
    SPENT_COST,
    CostOf,
    Dashboard,
    burn_rate_record,
    cost_increase,
)
from nvrx_slo.alerts.plan import Plan, Severity
from nvrx_slo.alerts.spec import Slo, Spec
from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.dashboards import panels as p
from nvrx_slo.dashboards import queries as q

UID = Dashboard.OVERVIEW.value  # stable: the alerts link to it

_SLI_NOTE = ("The SLI counts settled badput only: work since the last durable checkpoint is not bad until a "
             "fault rolls it back (then all of it lands in lost at once).")


_RECORDED = ("Reads {name}, recorded by the generated alert rules (the series the burn-rate alerts fire on): "
             "it needs those rules installed (deploy/base's PrometheusRule, or alerts/generated/rules.yaml). "
             "Job-level, so the pod variable does not apply.")


def _efficiency(spec: Spec, plan: Plan) -> list[object]:
    objective = spec.objectives[Slo.EFFICIENCY]
    target = f"{objective.target:.0%}"
    period = duration.format(plan.period)
    pages = [w for w in plan.burn_windows if w.severity is Severity.PAGE]
    fastest = max(pages, key=lambda w: w.factor)
    objective_steps = ((None, p.RED), (objective.target, p.GREEN))
    return [
        p.stat("Efficiency since job start", "productive / wall rank-seconds since the job's first process start "
               f"(rank-average). Objective {target}. Work since the last durable checkpoint counts only once a "
               "save lands, so this dips between checkpoints.",
               [p.Query(q.efficiency(None))], p.RATIO, steps=objective_steps, decimals=2),
        p.stat("Error budget remaining", f"Share of the {period} error budget ({objective.budget:.0%} of wall) not "
               "yet spent (the part of the period before the job started counts as healthy). Negative once "
               f"overspent. {_SLI_NOTE} " + _RECORDED.format(name=ERROR_BUDGET_REMAINING),
               [p.Query(q.slo_record(ERROR_BUDGET_REMAINING, Slo.EFFICIENCY))], p.RATIO,
               steps=((None, p.RED), (0.0, p.YELLOW), (0.25, p.GREEN)), decimals=1),
        p.stat(f"Burn rate ({duration.format(fastest.long)})", "Error-budget burn rate over the fastest page's long "
               f"window (1 = spending exactly the budget). Pages at {fastest.factor:g}× over "
               f"{duration.format(fastest.long)} and {duration.format(fastest.short)}. "
               + _RECORDED.format(name=burn_rate_record(fastest.long)),
               [p.Query(q.slo_record(burn_rate_record(fastest.long), Slo.EFFICIENCY))], p.COUNT,
               steps=((None, p.GREEN), (1.0, p.YELLOW), (fastest.factor, p.RED)), decimals=1),
        p.stat("Unprotected work", "Rank-seconds of training since the last durable checkpoint, summed over the job: "
               "lost if a fault comes now.", [p.Query(q.by((), q.series(cat.UNPROTECTED_WORK)))], p.SECONDS),
        p.timeseries("Efficiency vs objective", f"The efficiency SLI (1 − settled badput / wall) since job start and "
                     f"over the rate window, and productive / wall since job start; dashed: the {target} objective. "
                     f"{_SLI_NOTE}",
                     [p.Query(f"1 - {q.badput_ratio(None)}", "SLI since job start"),
                      p.Query(f"1 - {q.badput_ratio(q.RATE_INTERVAL)}", "SLI over rate window"),
                      p.Query(q.efficiency(None), "productive / wall since job start")],
                     p.RATIO, steps=objective_steps),
        p.timeseries("Burn rates", "Error-budget burn rate over each page window (1 = on budget). Dashed: the page "
                     "factors; both windows of a pair must exceed theirs to page. " + _RECORDED.format(
                         name=", ".join(burn_rate_record(s) for w in pages for s in (w.long, w.short))),
                     [p.Query(q.slo_record(burn_rate_record(s), Slo.EFFICIENCY), duration.format(s))
                      for w in pages for s in (w.long, w.short)],
                     p.COUNT, steps=((None, p.GREEN),
                                     *((w.factor, p.RED) for w in sorted(pages, key=lambda w: w.factor)))),
    ]


def _time(spec: Spec) -> list[object]:
    return [
        p.timeseries("Where the time went (since job start)", "Each settled category's share of wall rank-seconds "
                     "since the job started, plus the provisional unprotected slice; the stack sums to 100%.",
                     [p.Query(q.category_share(cat.SETTLED_CATEGORIES, None), "{{category}}"),
                      p.Query(q.unprotected_share(), cat.Category.UNPROTECTED.value)],
                     p.RATIO, stack=True),
        p.timeseries("Badput breakdown (rate window)", "Share of wall rank-seconds per badput category over the "
                     "rate window, stacked: what is eating the budget now.",
                     [p.Query(q.category_share(cat.BADPUT_CATEGORIES, q.RATE_INTERVAL), "{{category}}")],
                     p.RATIO, stack=True),
        p.table("Firing alerts", "Prometheus ALERTS for this job that are firing, by alert and severity (the "
                "generated nvrx-slo rules keep the job's namespace and job_name labels).",
                p.Query(q.alerts_firing()), h=7),
        p.stat("Restarts since job start", "Restarts by level (in-process, in-job via ft_launcher, pod) since the "
               "job's first start (each fault once, however many pods it restarted).",
               [p.Query(q.busiest_pod(q.series(cat.RESTARTS), (q.LEVEL_LABEL,)), "{{level}}")],
               p.COUNT, h=7),
        p.stat("Checkpoint age", "Seconds since the latest durable checkpoint finished, per pod. Red after "
               f"{duration.format(spec.alerts.checkpoint_stale_after)}, when the stale-checkpoint alert fires.",
               [p.Query(f"time() - {q.series(cat.CKPT_LAST_SUCCESS)}", "{{pod}}")], p.SECONDS,
               steps=((None, p.GREEN), (float(spec.alerts.checkpoint_stale_after), p.RED)), h=7),
    ]


def _cost(spec: Spec, plan: Plan) -> list[object]:
    """What badput cost: the dashboard range's accelerator-hours and money, by cause, and the error
    budget in both (alerts/cost.py's records)."""
    period = duration.format(plan.period)
    currency = spec.price.currency if spec.price is not None else "the price's currency"
    money = f"In {currency}; price_source says what priced it (OpenCost's node_gpu_hourly_cost, or the SLO spec)."
    hours = cost_increase(CostOf.CATEGORY, False)
    return [
        p.stat("Badput accelerator-hours (time range)", "Accelerator-hours of badput in the dashboard's time "
               "range: rank-seconds of every badput category (absent ranks included) × the accelerators each "
               "rank holds. " + _RECORDED.format(name=hours),
               [p.Query(q.over_range(hours, (), per=3600))], p.COUNT, decimals=3),
        p.stat("Badput cost (time range)", f"What the badput in the time range cost. {money} "
               + _RECORDED.format(name=cost_increase(CostOf.CATEGORY, True)),
               [p.Query(q.over_range(cost_increase(CostOf.CATEGORY, True), (PRICE_SOURCE_LABEL,)),
                        "{{price_source}}")], p.COUNT, decimals=2),
        p.stat(f"Error budget ({period}) in accelerator-hours", f"The efficiency error budget over the {period} "
               "period in accelerator-hours (1 − objective of the job's most ranks × accelerators per rank × the "
               "period), and how much of it badput spent. " + _RECORDED.format(name=BUDGET_ACCELERATOR_HOURS),
               [p.Query(q.slo_record(BUDGET_ACCELERATOR_HOURS, Slo.EFFICIENCY), "budget"),
                p.Query(q.slo_record(SPENT_ACCELERATOR_HOURS, Slo.EFFICIENCY), "spent")], p.COUNT, decimals=2),
        p.stat(f"Error budget ({period}) in money", f"The same budget and spend at the job's price per rank-hour. "
               f"{money} " + _RECORDED.format(name=BUDGET_COST),
               [p.Query(q.slo_record(BUDGET_COST, Slo.EFFICIENCY), "budget ({{price_source}})"),
                p.Query(q.slo_record(SPENT_COST, Slo.EFFICIENCY), "spent ({{price_source}})")], p.COUNT, decimals=2),
        p.timeseries("Badput cost by cause", "What each cause of fault cost per interval (lost, restart and "
                     f"absent time; pod_lost: a node or pod gone). {money} "
                     + _RECORDED.format(name=cost_increase(CostOf.CAUSE, True)),
                     [p.Query(q.per_interval(cost_increase(CostOf.CAUSE, True), (CAUSE_LABEL,)), "{{cause}}")],
                     p.COUNT, stack=True, bars=True, w=24),
    ]


def dashboard(spec: Spec, plan: Plan) -> g.Dashboard:
    target = spec.objectives[Slo.EFFICIENCY].target
    return p.dashboard(
        uid=UID, title="nvrx-slo / SLO overview", module="overview",
        description=f"Training efficiency SLO ({target:.0%} of accelerator time trains the model) for one job.",
        panels=[p.row("Efficiency SLO"), *_efficiency(spec, plan), p.row("Time accounting and alerts"), *_time(spec),
                p.row("What badput cost"), *_cost(spec, plan)],
    )
