"""Fleet: every job in a namespace (or the cluster) ranked by what its badput cost, the causes across
jobs over time, each job's efficiency against its objective and its error budget in accelerator-hours,
with links to each job's own dashboards. Reads the cost records (alerts/cost.py) and the SLO records."""

from __future__ import annotations

from grafanalib import core as g

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.conventions import (
    BUDGET_ACCELERATOR_HOURS,
    CATEGORY_LABEL,
    CAUSE_LABEL,
    PRICE_SOURCE_LABEL,
    SLO_LABEL,
    SPENT_ACCELERATOR_HOURS,
    CostOf,
    Dashboard,
    cost_increase,
    error_ratio_record,
)
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.spec import Slo, Spec
from nvrx_slo.dashboards import panels as p
from nvrx_slo.dashboards import queries as q

UID = Dashboard.FLEET.value
JOB = (q.NAMESPACE_LABEL, q.JOB_LABEL)
_RECORDED = " Reads the generated rules' records (alerts/cost.py): it needs them installed."


def _links() -> list[tuple[str, str]]:
    """A job's own dashboards, from its row of a table."""
    query = "var-namespace=${__data.fields.namespace}&var-job=${__data.fields.job_name}&${__url_time_range}"
    return [(f"{title} of ${{__data.fields.job_name}}", f"/d/{uid.value}?{query}")
            for title, uid in (("SLO overview", Dashboard.OVERVIEW), ("Recovery", Dashboard.RECOVERY))]


def dashboard(spec: Spec, plan: Plan) -> g.Dashboard:
    objective = spec.objectives[Slo.EFFICIENCY].target
    period = duration.format(plan.period)
    currency = spec.price.currency if spec.price is not None else "the price's currency"
    matchers = q.FLEET_MATCHERS
    cost, hours = cost_increase(CostOf.CATEGORY, True), cost_increase(CostOf.CATEGORY, False)
    by_cause, hours_by_cause = cost_increase(CostOf.CAUSE, True), cost_increase(CostOf.CAUSE, False)
    ratio = q.fleet_record(error_ratio_record(plan.period), **{SLO_LABEL: Slo.EFFICIENCY.value})
    panels = [
        p.row("Jobs by what their badput cost"),
        p.table("Jobs by badput cost (time range)", f"Every job's badput cost in the dashboard's time range, "
                f"in {currency}, most first, with the source that priced it; click a row for the job's "
                "dashboards." + _RECORDED,
                p.Query(f"sort_desc({q.over_range(cost, (*JOB, PRICE_SOURCE_LABEL), matchers)})"), w=12, h=9,
                links=_links()),
        p.table("Jobs by badput accelerator-hours (time range)", "Every job's badput in accelerator-hours in the "
                "time range, most first." + _RECORDED,
                p.Query(f"sort_desc({q.over_range(hours, JOB, matchers, per=3600)})"), w=12, h=9, links=_links()),
        p.row("Causes across jobs"),
        p.timeseries("Badput cost by cause, every job", f"What each cause of fault cost per interval, summed over "
                     f"the jobs (lost, restart and absent time; pod_lost: a node or pod gone), in {currency}."
                     + _RECORDED, [p.Query(q.per_interval(by_cause, (CAUSE_LABEL,), matchers), "{{cause}}")],
                     p.COUNT, stack=True, bars=True),
        p.timeseries("Badput accelerator-hours by category, every job", "Badput per interval by category, summed "
                     "over the jobs, in accelerator-hours." + _RECORDED,
                     [p.Query(q.per_interval(hours, (CATEGORY_LABEL,), matchers, per=3600), "{{category}}")],
                     p.COUNT, stack=True, bars=True),
        p.table("Causes by job (time range)", "Each job's fault accelerator-hours in the time range by cause."
                + _RECORDED,
                p.Query(f"sort_desc({q.over_range(hours_by_cause, (*JOB, CAUSE_LABEL), matchers, per=3600)})"),
                w=24, h=8, links=_links()),
        p.row("Efficiency against its objective"),
        p.stat(f"Efficiency over the {period} period", f"1 − each job's efficiency error ratio over the SLO period "
               f"(the SLI its burn-rate alerts fire on), against the {objective:.0%} objective.",
               [p.Query(f"1 - {ratio}", "{{namespace}}/{{job_name}}")], p.RATIO,
               steps=((None, p.RED), (objective, p.GREEN)), decimals=2, w=12, h=8),
        p.table(f"Error budget ({period}) in accelerator-hours", "Each job's efficiency error budget over the "
                "period in accelerator-hours, and how much of it badput spent." + _RECORDED,
                p.Query(f"{q.fleet_record(SPENT_ACCELERATOR_HOURS)} / {q.fleet_record(BUDGET_ACCELERATOR_HOURS)}"),
                w=12, h=8, links=_links()),
    ]
    return p.dashboard(uid=UID, title="nvrx-slo / Fleet: what badput cost", module="fleet",
                       description="Every training job ranked by what its badput cost, its causes, and each job's "
                                   "efficiency against its objective.", panels=panels, fleet=True)
