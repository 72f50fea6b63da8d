"""What badput costs: accelerator-hours and money per job, per category and per cause, over the SLO
windows (one generation step: ``cost_group``), and the efficiency error budget in both. The badput
increments by category and the budget are the efficiency group's (``efficiency_rules``, recorded
after its own records, which they read: a group reads its own records of this evaluation, another
group's of this one or the one before).

Prices. Where OpenCost runs, a pod's accelerator-hour costs its node's ``node_gpu_hourly_cost``
(joined to the pod through kube-state-metrics' ``kube_pod_info{node}``); elsewhere the spec's cost
section prices it, by the pod's accelerator model (``nvrx_rank_accelerators``' label), else its
default. Every cost series says which priced it (``price_source``); a pod that neither prices has
accelerator-hours and no cost. Accelerator-seconds are rank-seconds × the pod's accelerators per rank.

Counting, as the efficiency SLI counts its badput (``alerts/sli.py``), from its own per-target
record by category: each scrape target's counters, newest samples within two evaluations, read
once per evaluation; the job's increment is each target's increase since the evaluation before,
priced at that target's price, so bursts add up exactly and add up to the SLI's badput. A fault
cause a target has not reported before counts from 0 if the target was there the evaluation before
(the sidecar exports only the causes it has seen). Rank-seconds no pod accounted are the
efficiency group's records: the absent ranks (category ``absent``) and a vanished pod's work at
risk (category ``lost``), both caused by a pod or node gone (``pod_lost``), priced at the job's
highest rank-hour price and accelerators per rank.

Windows. Each increment is summed over each SLO window up to the first page pair's long window
(the tile: 1h for a 30-day period) directly, a window just short of the window read so that an
evaluation on its edge is read by one window only (``[a, b]`` before Prometheus 3.0, ``(a, b]``
since); a longer window adds the tile records at tile-aligned instants (a subquery), so a 30-day
window reads 720 samples of each series, not 43,200 — and ends at the last whole tile: it lags by
up to a tile. The error budget over the period is (1 − target) × the job's most ranks in the
period × its accelerators per rank × the period; what it spent, the SLI's error ratio over the
period × the same, so it agrees with the budget the burn-rate alerts read, to the second.
"""

from __future__ import annotations

from typing import Any

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.conventions import (
    ABSENT_RANKS,
    ACCELERATOR_LABEL,
    BUDGET_ACCELERATOR_HOURS,
    BUDGET_COST,
    CATEGORY_LABEL,
    CAUSE_LABEL,
    JOB_ACCELERATORS,
    JOB_LABELS,
    JOB_RANK_PRICE,
    ON_JOB,
    PRICE_SOURCE_LABEL,
    SLO_LABEL,
    SPEC_DEFAULT_PRICE,
    SPEC_PRICE,
    SPENT_ACCELERATOR_HOURS,
    SPENT_COST,
    TARGET_ACCELERATORS,
    TARGET_CATEGORY_INCREASE,
    TARGET_CAUSE,
    TARGET_RANK_PRICE,
    VANISHED_AT_RISK,
    CostOf,
    PriceSource,
    cost_increase,
    cost_over,
    error_ratio_record,
    sli_total_record,
)
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.spec import Slo, Spec
from nvrx_slo.alerts.tiers import Group, Tier, tiered
from nvrx_slo.contracts import catalogue as cat

Rule = dict[str, Any]

OPENCOST_PRICE = "node_gpu_hourly_cost"  # OpenCost: what one GPU of the node costs an hour
POD_NODE = "kube_pod_info"  # kube-state-metrics: the node each pod runs on
_BY = {CostOf.CATEGORY: CATEGORY_LABEL, CostOf.CAUSE: CAUSE_LABEL}


def _just_under(seconds: int) -> str:
    """A range a millisecond short of ``seconds``: it holds the samples of exactly ``seconds``."""
    return f"{duration.format(seconds - 1)}999ms" if seconds > 1 else "999ms"


def _by(*labels: str) -> str:
    return f"by ({', '.join((*JOB_LABELS, *labels))})"


def _part(name: str, expr: str) -> str:
    return f'label_replace({expr}, "part", "{name}", "", "")'


def _priced(spec: Spec) -> str:
    """Each target's price of one accelerator-hour, with the source that priced it."""
    accelerators = f"0 * {TARGET_ACCELERATORS}"
    parts = [f"label_replace(\n  {accelerators}\n  + on (namespace, pod) group_left\n"
             f"  max by (namespace, pod) ({POD_NODE} * on (node) group_left max by (node) ({OPENCOST_PRICE})),\n"
             f'  "{PRICE_SOURCE_LABEL}", "{PriceSource.OPENCOST.value}", "", "")']
    price = spec.price
    if price is not None:
        spec_parts = []
        if price.by_model:
            spec_parts.append(f"{accelerators} + on ({ACCELERATOR_LABEL}) group_left {SPEC_PRICE}")
        if price.default is not None:
            spec_parts.append(f"{accelerators} + on () group_left {SPEC_DEFAULT_PRICE}")
        parts.append(f"label_replace(\n  {' or '.join(spec_parts)},\n"
                     f'  "{PRICE_SOURCE_LABEL}", "{PriceSource.SPEC.value}", "", "")')
    return f"\nor ignoring ({PRICE_SOURCE_LABEL})\n".join(parts)


def _spec_prices(spec: Spec) -> list[Rule]:
    price = spec.price
    if price is None:
        return []
    rules = [{"record": SPEC_PRICE, "expr": f"vector({value!r})", "labels": {ACCELERATOR_LABEL: model}}
             for model, value in sorted(price.by_model.items())]
    if price.default is not None:
        rules.append({"record": SPEC_DEFAULT_PRICE, "expr": f"vector({price.default!r})"})
    return rules


def _targets(spec: Spec, plan: Plan) -> list[Rule]:
    """Each target's accelerators, price and fault seconds, read once per evaluation; the job's.
    Its badput by category is the efficiency group's (``TARGET_CATEGORY_INCREASE``)."""
    fresh = duration.format(2 * plan.evaluation_interval)
    price = _priced(spec)
    return [
        {"record": TARGET_ACCELERATORS, "expr": f"last_over_time({cat.RANK_ACCELERATORS.name}[{fresh}])"},
        {"record": TARGET_RANK_PRICE,
         "expr": f"sum without ({ACCELERATOR_LABEL}) (\n  {TARGET_ACCELERATORS}\n"
                 f"  * ignoring ({PRICE_SOURCE_LABEL}) group_right ()\n  (\n{price}\n  )\n)"},
        {"record": JOB_ACCELERATORS, "expr": f"max {_by()} ({TARGET_ACCELERATORS})"},
        {"record": JOB_RANK_PRICE,
         "expr": f"topk {_by()} (1, max {_by(PRICE_SOURCE_LABEL)} ({TARGET_RANK_PRICE}))"},
        {"record": TARGET_CAUSE, "expr": _fault_seconds(plan)},
    ]


def _pods(of: CostOf, plan: Plan) -> str:
    """Each target's badput rank-seconds by ``of`` since the evaluation before: by category, the
    efficiency group's increments; by cause, its fault seconds now (the counters, not
    ``TARGET_CAUSE`` read back, which vmalert would give as of the evaluation before) less its
    record then — a cause new to a target counts from 0 if the target was there then."""
    e = duration.format(plan.evaluation_interval)
    if of is CostOf.CATEGORY:
        return f'sum without ({SLO_LABEL}) ({TARGET_CATEGORY_INCREASE}{{{SLO_LABEL}="{Slo.EFFICIENCY.value}"}})'
    now = _fault_seconds(plan)
    there = f"last_over_time({TARGET_ACCELERATORS}[5m] offset {e})"  # the target was there: a new cause from 0
    then = (f"last_over_time({TARGET_CAUSE}[5m] offset {e})\n"
            f"    or 0 * {now} and ignoring ({CAUSE_LABEL}, {ACCELERATOR_LABEL}) {there}")
    return f"clamp_min({now} - (\n    {then}\n  ), 0)"


def _fault_seconds(plan: Plan) -> str:
    """Each target's fault seconds by cause, newest within two evaluations (as the badput's)."""
    return f"last_over_time({cat.FAULT_TIME.name}[{duration.format(2 * plan.evaluation_interval)}])"


def _gone(of: CostOf, plan: Plan) -> dict[str, tuple[str, str]]:
    """The job's rank-seconds no pod accounted at this evaluation: ``of``'s label value, rank-seconds."""
    e = plan.evaluation_interval
    if of is CostOf.CATEGORY:
        return {"absent": (cat.Category.ABSENT.value, f"{ABSENT_RANKS} * {e}"),
                "vanished": (cat.Category.LOST.value, VANISHED_AT_RISK)}
    lost = cat.FaultCause.POD_LOST.value
    return {"absent": (lost, f"{ABSENT_RANKS} * {e}"), "vanished": (lost, VANISHED_AT_RISK)}


def _increase(of: CostOf, money: bool, plan: Plan) -> str:
    """The job's badput accelerator-seconds (or money) by ``of`` since the evaluation before."""
    label = _by(_BY[of], *((PRICE_SOURCE_LABEL,) if money else ()))
    recent = duration.format(plan.base + 2 * plan.evaluation_interval)  # a gone pod's last, a window ago
    if money:
        pods = (f"{_pods(of, plan)}\n  * ignoring ({_BY[of]}, {PRICE_SOURCE_LABEL}) group_left ({PRICE_SOURCE_LABEL})"
                f" {TARGET_RANK_PRICE} / 3600")
        job = f"topk {_by()} (1, max_over_time({JOB_RANK_PRICE}[{recent}])) / 3600"
    else:
        pods = f"{_pods(of, plan)}\n  * ignoring ({_BY[of]}, {ACCELERATOR_LABEL}) group_left {TARGET_ACCELERATORS}"
        job = f"max_over_time({JOB_ACCELERATORS}[{recent}])"
    parts = [_part("pods", pods)]
    for name, (value, seconds) in _gone(of, plan).items():
        tagged = f'label_replace({seconds}, "{_BY[of]}", "{value}", "", "")'
        keep = f" ({PRICE_SOURCE_LABEL})" if money else ""
        parts.append(_part(name, f"{tagged}\n  * {ON_JOB} group_left{keep} {job}"))
    return f"sum {label} (\n  " + "\n  or ".join(parts) + "\n)"


def _windows(of: CostOf, money: bool, plan: Plan) -> list[Rule]:
    """The increments over every SLO window: directly up to the tile, in whole tiles beyond it."""
    tile = plan.burn_windows[0].long
    per = "" if money else " / 3600"
    rules = []
    for window in plan.windows:
        if window <= tile:
            expr = f"sum_over_time({cost_increase(of, money)}[{_just_under(window)}]){per}"
        else:
            expr = f"sum_over_time({cost_over(of, money, tile)}[{_just_under(window)}:{duration.format(tile)}])"
        rules.append({"record": cost_over(of, money, window), "expr": expr})
    return rules


def _most(selector: str, tile: int, period: int) -> str:
    """The most ``selector`` was over the period: at each whole tile's end, and all through the last
    tile (so a job younger than a tile has one) — a subquery of 720 points, not 43,200 samples."""
    recent = _part("recent", f"max_over_time({selector}[{_just_under(tile)}])")
    tiles = _part("tiles", f"max_over_time({selector}[{_just_under(period)}:{duration.format(tile)}])")
    return f"max without (part) ({recent} or {tiles})"


def _budget(spec: Spec, plan: Plan) -> list[Rule]:
    """The efficiency SLO's error budget over the period, in accelerator-hours and money, and what
    of it was spent: the SLI's own error ratio over the period in the same units, so spent over
    budget is the burn rate and 1 − that the budget remaining the alerts read. Global: joined on
    every label but their own (a global ruler's shards add theirs)."""
    budget = spec.objectives[Slo.EFFICIENCY].budget
    tile, period = plan.burn_windows[0].long, plan.period
    mine = {SLO_LABEL: Slo.EFFICIENCY.value}
    ranks = _most(f'{sli_total_record(plan.base)}{{{SLO_LABEL}="{Slo.EFFICIENCY.value}"}}', tile, period)
    rank_hours = f"{ranks} * {budget:g} * {period / 3600!r}"  # the budget as the burn rates divide by it
    price = f"topk without ({PRICE_SOURCE_LABEL}) (1, {_most(JOB_RANK_PRICE, tile, period)})"
    ratio = f'{error_ratio_record(period)}{{{SLO_LABEL}="{Slo.EFFICIENCY.value}"}}'
    return [
        {"record": BUDGET_ACCELERATOR_HOURS,
         "expr": f"{rank_hours}\n* ignoring ({SLO_LABEL}) group_left {_most(JOB_ACCELERATORS, tile, period)}",
         "labels": mine},
        {"record": BUDGET_COST,
         "expr": f"{rank_hours}\n* ignoring ({SLO_LABEL}, {PRICE_SOURCE_LABEL}) group_left ({PRICE_SOURCE_LABEL})\n"
                 f"{price}", "labels": mine},
        {"record": SPENT_ACCELERATOR_HOURS, "expr": f"{ratio} / {budget:g} * {BUDGET_ACCELERATOR_HOURS}",
         "labels": mine},
        {"record": SPENT_COST,
         "expr": f"{BUDGET_COST}\n* ignoring ({PRICE_SOURCE_LABEL}) group_left {ratio} / {budget:g}", "labels": mine},
    ]


def efficiency_rules(spec: Spec, plan: Plan) -> list[tuple[Tier, Rule]]:
    """For the efficiency group, after its own rules (``generate.rule_groups``): the badput increments
    by category, and the error budget in accelerator-hours and money."""
    increments = [{"record": cost_increase(CostOf.CATEGORY, money), "expr": _increase(CostOf.CATEGORY, money, plan)}
                  for money in (False, True)]
    return [*tiered(Tier.LOCAL, increments), *tiered(Tier.GLOBAL, _budget(spec, plan))]


def cost_group(spec: Spec, plan: Plan) -> Group:
    """The prices and the increments by cause read the pods' series (``Tier.LOCAL``); the windows
    only the increments, the efficiency group's by category too (``Tier.GLOBAL``). The absent ranks
    and a vanished pod's work at risk come from the efficiency group's records of this evaluation or
    the one before."""
    increments = [{"record": cost_increase(CostOf.CAUSE, money), "expr": _increase(CostOf.CAUSE, money, plan)}
                  for money in (False, True)]
    windows = [rule for of in CostOf for money in (False, True) for rule in _windows(of, money, plan)]
    return Group("nvrx-slo-cost", plan.evaluation_interval,
                 (*tiered(Tier.LOCAL, [*_spec_prices(spec), *_targets(spec, plan), *increments]),
                  *tiered(Tier.GLOBAL, windows)))
