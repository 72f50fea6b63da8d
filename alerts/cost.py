"""What badput costs: accelerator-hours and money per job, per category and per cause, over the SLO
windows (one generation step: ``cost_group``), and the efficiency error budget in both. The
increments and the budget are the efficiency group's (``efficiency_rules``).

Every rule reads what the pods export and the records of evaluations before its own, never a record
of its own evaluation: vmalert writes what it records asynchronously, so such a read would give the
evaluation before, or nothing (docs/scaling.md). An increment is therefore computed from the pods'
counters now, less its record an evaluation ago, in each rule that needs it.

Prices. Where OpenCost runs, a pod's accelerator-hour costs its node's ``node_gpu_hourly_cost``
(joined to the pod through kube-state-metrics' ``kube_pod_info{node}``); elsewhere the spec's cost
section prices it, by the pod's accelerator model (``nvrx_rank_accelerators``' label), else its
default. Every cost series says which priced it (``price_source``); a pod that neither prices has
accelerator-hours and no cost. Accelerator-seconds are rank-seconds × the pod's accelerators per rank.

Counting, as the efficiency SLI counts its badput (``alerts/sli.py``): each scrape target's counters
by category, newest samples within two evaluations, less the SLI's per-target record of them an
evaluation ago; the job's increment is each target's, priced at that target's price, so bursts add
up exactly and add up to the SLI's badput. A young target new to the rules counts from 0
(``sli.increase``), and so does a fault cause a target has not reported before if the target was
there the evaluation before (the sidecar exports only the causes it has seen). Rank-seconds no pod
accounted are the efficiency SLI's: the absent ranks (category ``absent``) and a vanished pod's work
at risk (category ``lost``), both caused by a pod or node gone (``pod_lost``), priced at the job's
highest rank-hour price and accelerators per rank.

Windows. Each increment is summed over each SLO window up to the tile (the first page pair's long
window: 1h for a 30-day period) directly, and over a longer one from its tiles (``alerts/tiles.py``),
a window just short of the window read so that an evaluation on its edge is read by one window only
(``[a, b]`` before Prometheus 3.0, ``(a, b]`` since). The error budget over the period is
(1 − target) × the job's most ranks in the period × its accelerators per rank × the period; what it
spent, the SLI's error ratio over the period × the same, so it agrees with the budget the burn-rate
alerts read, to the second.
"""

from __future__ import annotations

import json
from typing import Any

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.conventions import (
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
    SPENT_ACCELERATOR_HOURS,
    SPENT_COST,
    TARGET_ACCELERATORS,
    TARGET_CAUSE,
    CostOf,
    PriceSource,
    cost_increase,
    cost_over,
    error_ratio_record,
    ranks,
)
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.sli import absent_ranks, increase, target_category_increase, vanished_at_risk
from nvrx_slo.alerts.spec import Slo, Spec
from nvrx_slo.alerts.tiers import Group, Tier, period_group, tiered
from nvrx_slo.alerts.tiles import Agg, Tiled, just_under
from nvrx_slo.contracts import catalogue as cat

Rule = dict[str, Any]

OPENCOST_PRICE = "node_gpu_hourly_cost"  # OpenCost: what one GPU of the node costs an hour
POD_NODE = "kube_pod_info"  # kube-state-metrics: the node each pod runs on
_BY = {CostOf.CATEGORY: CATEGORY_LABEL, CostOf.CAUSE: CAUSE_LABEL}


def _by(*labels: str) -> str:
    return f"by ({', '.join((*JOB_LABELS, *labels))})"


def _part(name: str, expr: str) -> str:
    return f'label_replace({expr}, "part", "{name}", "", "")'


def _accelerators(plan: Plan) -> str:
    """Each target's accelerators per rank (label ``accelerator``: the model), newest within two
    evaluations (as the badput's counters are read)."""
    return f"last_over_time({cat.RANK_ACCELERATORS.name}[{duration.format(2 * plan.evaluation_interval)}])"


def _quoted(model: str) -> str:
    """``model`` as a PromQL string that ``label_replace`` writes as it is (``$`` doubled)."""
    return json.dumps(model.replace("$", "$$"))


def _spec_price(spec: Spec, accelerators: str) -> str | None:
    """The spec's price of one accelerator-hour of each target's model (``accelerators``' label),
    else its default: literals, so no rule reads a record of the spec's prices back (``_pods``)."""
    price = spec.price
    if price is None:
        return None
    parts = []
    if price.by_model:
        models = " or ".join(f'label_replace(vector({value!r}), "{ACCELERATOR_LABEL}", {_quoted(model)}, "", "")'
                             for model, value in sorted(price.by_model.items()))
        parts.append(f"0 * {accelerators} + on ({ACCELERATOR_LABEL}) group_left () ({models})")
    if price.default is not None:
        parts.append(f"0 * {accelerators} + on () group_left vector({price.default!r})")
    return " or ".join(parts)


def _rank_price(spec: Spec, plan: Plan) -> str:
    """What one rank-hour of each target costs (its accelerators × one's price), with the source
    that priced it (``price_source``): OpenCost's price of its node, else the spec's."""
    accelerators = _accelerators(plan)
    parts = [f"label_replace(\n  0 * {accelerators}\n  + on (namespace, pod) group_left\n"
             f"  max by (namespace, pod) ({POD_NODE} * on (node) group_left max by (node) ({OPENCOST_PRICE})),\n"
             f'  "{PRICE_SOURCE_LABEL}", "{PriceSource.OPENCOST.value}", "", "")']
    spec_price = _spec_price(spec, accelerators)
    if spec_price is not None:
        parts.append(f"label_replace(\n  {spec_price},\n"
                     f'  "{PRICE_SOURCE_LABEL}", "{PriceSource.SPEC.value}", "", "")')
    price = f"\nor ignoring ({PRICE_SOURCE_LABEL})\n".join(parts)
    return (f"sum without ({ACCELERATOR_LABEL}) (\n  {accelerators}\n"
            f"  * ignoring ({PRICE_SOURCE_LABEL}) group_right ()\n  (\n{price}\n  )\n)")


def _targets(spec: Spec, plan: Plan) -> list[Rule]:
    """Each target's accelerators (which targets were there, for the next evaluation's increments),
    and the job's most accelerators per rank and rank-hour price (what its absent ranks cost): each
    from the pods' series, none from another record of this evaluation."""
    return [
        {"record": TARGET_ACCELERATORS, "expr": _accelerators(plan)},
        {"record": JOB_ACCELERATORS, "expr": f"max {_by()} ({_accelerators(plan)})"},
        {"record": JOB_RANK_PRICE,
         "expr": f"topk {_by()} (1, max {_by(PRICE_SOURCE_LABEL)} (\n{_rank_price(spec, plan)}\n))"},
    ]


def _pods(of: CostOf, plan: Plan) -> str:
    """Each target's badput rank-seconds by ``of`` since the evaluation before: its counters now less
    its record then (by category: the efficiency SLI's increments, ``target_category_increase``; by
    cause: its fault seconds, a cause new to a target counting from 0 if the target was there then;
    both through ``sli.increase``, which counts a young target with no base from 0).
    Every term of this evaluation is an expression over the pods' series, never a record of it read
    back: vmalert writes what it records asynchronously (docs/scaling.md), and an increment read
    against a record of its own evaluation would lose or repeat a burst."""
    if of is CostOf.CATEGORY:
        return target_category_increase(plan)
    e = duration.format(plan.evaluation_interval)
    there = f"max without ({ACCELERATOR_LABEL}) (last_over_time({TARGET_ACCELERATORS}[5m] offset {e}))"
    causes = tuple(c.value for c in cat.FaultCause)
    return increase(TARGET_CAUSE, _fault_seconds(plan), CAUSE_LABEL, causes, plan, known=there)


def _fault_seconds(plan: Plan) -> str:
    """Each target's fault seconds by cause, newest within two evaluations (as the badput's)."""
    return f"last_over_time({cat.FAULT_TIME.name}[{duration.format(2 * plan.evaluation_interval)}])"


def _gone(of: CostOf, plan: Plan) -> dict[str, tuple[str, str]]:
    """The job's rank-seconds no pod accounted at this evaluation: ``of``'s label value, rank-seconds
    (the efficiency SLI's absent ranks and vanished work at risk, as expressions: ``_pods``)."""
    hold, e = plan.base, plan.evaluation_interval
    absent, vanished = f"({absent_ranks(hold)}) * {e}", vanished_at_risk(hold, e)
    if of is CostOf.CATEGORY:
        return {"absent": (cat.Category.ABSENT.value, absent), "vanished": (cat.Category.LOST.value, vanished)}
    lost = cat.FaultCause.POD_LOST.value
    return {"absent": (lost, absent), "vanished": (lost, vanished)}


def _increase(of: CostOf, money: bool, spec: Spec, plan: Plan) -> str:
    """The job's badput accelerator-seconds (or money) by ``of`` since the evaluation before. The
    rank-seconds no pod accounted are priced at the job's most over the last shortest window and two
    evaluations, as the evaluations before this one recorded it (a gone pod's last, a window ago)."""
    label = _by(_BY[of], *((PRICE_SOURCE_LABEL,) if money else ()))
    e = plan.evaluation_interval
    recent = f"[{duration.format(plan.base + e)}] offset {duration.format(e)}"
    if money:
        pods = (f"{_pods(of, plan)}\n  * ignoring ({_BY[of]}, {PRICE_SOURCE_LABEL}) group_left ({PRICE_SOURCE_LABEL})"
                f" (\n{_rank_price(spec, plan)}\n  ) / 3600")
        job = f"topk {_by()} (1, max_over_time({JOB_RANK_PRICE}{recent})) / 3600"
    else:
        pods = f"{_pods(of, plan)}\n  * ignoring ({_BY[of]}, {ACCELERATOR_LABEL}) group_left {_accelerators(plan)}"
        job = f"max_over_time({JOB_ACCELERATORS}{recent})"
    parts = [_part("pods", pods)]
    for name, (value, seconds) in _gone(of, plan).items():
        tagged = f'label_replace({seconds}, "{_BY[of]}", "{value}", "", "")'
        keep = f" ({PRICE_SOURCE_LABEL})" if money else ""
        parts.append(_part(name, f"{tagged}\n  * {ON_JOB} group_left{keep} {job}"))
    return f"sum {label} (\n  " + "\n  or ".join(parts) + "\n)"


def _windows(of: CostOf, money: bool, plan: Plan, *, period: bool = False) -> list[Rule]:
    """The increments over every SLO window but the period, and their tiles, or (``period``) over
    the period, as the tiles' group last made it (``Tiled.settled``): directly up to the tile, from
    its tiles beyond it (``alerts/tiles.py``), each window a millisecond short so an evaluation on
    its edge is read once."""
    per = "" if money else " / 3600"
    tiled = Tiled(cost_increase(of, money), Agg.SUM)
    if period:
        return [{"record": cost_over(of, money, plan.period), "expr": f"{tiled.settled(plan.period, plan)}{per}"}]
    rules = tiled.rules(plan)
    for window in plan.windows[:-1]:
        summed = (f"sum_over_time({cost_increase(of, money)}[{just_under(window)}])" if window <= plan.tile
                  else tiled.window(window, plan))
        rules.append({"record": cost_over(of, money, window), "expr": f"{summed}{per}"})
    return rules


def budget_rules(spec: Spec, plan: Plan) -> list[Rule]:
    """The efficiency SLO's error budget over the period, in accelerator-hours and money, and what
    of it was spent: the SLI's own error ratio over the period in the same units, so spent over
    budget is the burn rate and 1 − that the budget remaining the alerts read. The job's most ranks
    over the period is the one the SLI's ratio over the period divides by; its most accelerators
    per rank and rank-hour price come from tiles too. In the SLO's period group, after its ratio over
    the period. Global: joined on every label but their own (a global ruler's shards add theirs)."""
    budget = spec.objectives[Slo.EFFICIENCY].budget
    span = plan.period + plan.evaluation_interval  # as the SLI's ratios over long windows: alerts/rules.py
    mine = {SLO_LABEL: Slo.EFFICIENCY.value}
    accelerators, price = _job_tiles()
    rank_hours = (f"{ranks(Slo.EFFICIENCY.value, plan).settled(span, plan)}"
                  f" * {budget:g} * {plan.period / 3600!r}")  # the budget as the burn rates divide by it
    ratio = f'{error_ratio_record(plan.period)}{{{SLO_LABEL}="{Slo.EFFICIENCY.value}"}}'
    return [
        {"record": BUDGET_ACCELERATOR_HOURS,
         "expr": f"{rank_hours}\n* ignoring ({SLO_LABEL}) group_left {accelerators.settled(span, plan)}",
         "labels": mine},
        {"record": BUDGET_COST,
         "expr": f"{rank_hours}\n* ignoring ({SLO_LABEL}, {PRICE_SOURCE_LABEL}) group_left ({PRICE_SOURCE_LABEL})\n"
                 f"topk without ({PRICE_SOURCE_LABEL}) (1, {price.settled(span, plan)})", "labels": mine},
        {"record": SPENT_ACCELERATOR_HOURS, "expr": f"{ratio} / {budget:g} * {BUDGET_ACCELERATOR_HOURS}",
         "labels": mine},
        {"record": SPENT_COST,
         "expr": f"{BUDGET_COST}\n* ignoring ({PRICE_SOURCE_LABEL}) group_left {ratio} / {budget:g}", "labels": mine},
    ]


def _job_tiles() -> tuple[Tiled, Tiled]:
    """The job's most accelerators per rank and rank-hour price, tiled for the budget."""
    return Tiled(JOB_ACCELERATORS, Agg.MAX), Tiled(JOB_RANK_PRICE, Agg.MAX)


def efficiency_rules(spec: Spec, plan: Plan) -> list[tuple[Tier, Rule]]:
    """For the efficiency group, after its own rules (``generate.rule_groups``): each target's fault
    seconds by cause (the next evaluation's base: an increment is its counters less the record its
    own group made an evaluation ago, so the increments add up), the badput increments by category
    and by cause, and the tiles the error budget reads (``budget_rules``). In the group whose instants
    the SLI's absent ranks are recorded at, so ``absent`` and ``pod_lost`` count the evaluations the
    SLI counts (each rule computes them, at its group's instants)."""
    increments = [{"record": cost_increase(of, money), "expr": _increase(of, money, spec, plan)}
                  for of in CostOf for money in (False, True)]
    causes = {"record": TARGET_CAUSE, "expr": _fault_seconds(plan)}
    tiles = [rule for tiled in _job_tiles() for rule in tiled.rules(plan)]
    return [*tiered(Tier.LOCAL, [causes, *increments]), *tiered(Tier.GLOBAL, tiles)]


NAME = "nvrx-slo-cost"


def cost_groups(spec: Spec, plan: Plan) -> tuple[Group, Group]:
    """Each target's accelerators and fault seconds and the job's most accelerators and price read the
    pods' series (``Tier.LOCAL``); the windows only the efficiency group's increments (``Tier.GLOBAL``),
    the period's in a group of their own every ``plan.period_interval`` (``tiers.period_group``)."""
    windows = [rule for of in CostOf for money in (False, True) for rule in _windows(of, money, plan)]
    period = [rule for of in CostOf for money in (False, True) for rule in _windows(of, money, plan, period=True)]
    every = (*tiered(Tier.LOCAL, _targets(spec, plan)), *tiered(Tier.GLOBAL, windows))
    return Group(NAME, plan.evaluation_interval, every), period_group(NAME, plan, period)
