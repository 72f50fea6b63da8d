"""SLO rule groups: per-window error ratios, burn rates, budget remaining, burn-rate alerts.

One group per SLO, recording rules first and its alert last: Prometheus evaluates a group's rules
in order, so the alert reads this evaluation's ratios, not the previous one's. Every group runs
at the spec's ``evaluation_interval`` (the period's integral below depends on it), but the ratio
over the whole period and the budget left, which no alert reads: a group of their own runs them
every ``plan.period_interval``, from what the SLO's group made at its last evaluation.

Windows. Only the shortest window reads the exporter's series (a ``rate()`` over every rank's
counters, once per job and evaluation; for efficiency, each counter's increase since the
evaluation before, which adds up exactly where ``rate()`` extrapolates a burst of settled seconds
and loses part of it); every longer one averages the job-level rates recorded
over the shortest across the window's evaluations (time SLIs: ``sum_over_time`` over the number of
evaluations, so evaluations before the job count as 0; event SLIs: bad over total, both summed) —
one series per job, not one per rank and category, so a window's cost no longer grows with the pods
(``bench/bench_rules.py``). The price: a burst is smoothed over the shortest window at a window's
edges, and nothing before the rules first ran is seen.

Young jobs (and any window only partly covered by data). ``rate(x[1h])`` divides what happened
by the whole hour, but a plain ``rate(bad)/rate(wall)`` divides by the wall time that exists,
so a ten-minute-old job's "1h" ratio would be its lifetime ratio: the minute of init every job
starts with would read as a 10% error ratio and page. For time SLIs the denominator is therefore
the job's rank count (its wall rate over the shortest window; the most the window saw) times the
*whole* window: the part of a window before the job started counts as healthy. A young job then
pages exactly when an old job would on the same burn: one that is down from its first second
pages once 14.4% of an hour has burnt (8.6 min), as an old job going down does, and a few
minutes of init never page. Taking the most ranks the window saw, not the current count, keeps
a finished job's ratios from growing as its wall rate decays to zero. (Within its first shortest
window the rank count itself reads low, which scales long-window ratios by at most
shortest/long, e.g. 5m/1h: below every page threshold.) Event SLIs (restarts, saves) have no
events before the start, so their ratio needs no correction.
"""

from __future__ import annotations

from typing import Any

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.conventions import (
    BURN_ALERTS,
    ERROR_BUDGET_REMAINING,
    EVALUATIONS,
    SEVERITY_LABEL,
    SLO_LABEL,
    burn_rate_record,
    counter,
    error_ratio_record,
    evaluations,
    ranks,
    sli_bad_record,
    sli_total_record,
    stamp_links,
)
from nvrx_slo.alerts.plan import BurnWindow, Plan, Severity
from nvrx_slo.alerts.sli import Sli
from nvrx_slo.alerts.spec import Objective, Spec
from nvrx_slo.alerts.tiers import Group, Tier, period_group, tiered
from nvrx_slo.alerts.tiles import Agg, Tiled

Rule = dict[str, Any]


def _ratio(bad: str, total: str) -> str:
    """Matched on all their labels, not on the job's alone: the same in one Prometheus (both carry
    the job's and ``slo``), and in a global ruler a shard's external labels stay on the ratios and
    the alerts, and a job name in two shards stays two jobs."""
    return f"{bad}\n/\n({total} > 0)"


def _record(name: str, expr: str, sli: Sli) -> Rule:
    return {"record": name, "expr": expr, "labels": {SLO_LABEL: sli.slo.value}}


def job_rates(sli: Sli, plan: Plan) -> list[Rule]:
    """The SLI's job-level rates over the shortest window, from the pods' series: what the windows
    read (``tiers.Tier.LOCAL``), after the counter of the evaluations that recorded them."""
    base = plan.base
    return [
        _record(EVALUATIONS, "vector(1)", sli),
        *(_record(name, expr, sli) for name, expr in sli.records),
        _record(sli_total_record(base), sli.total(duration.format(base)), sli),  # the bad rate's "0 for this job"
        _record(sli_bad_record(base), sli.bad(duration.format(base)), sli),
    ]


def _tiled(sli: Sli, plan: Plan) -> tuple[Tiled, ...]:
    """What the SLI's windows longer than the tile read from tiles: its bad rate summed; its rank
    count (time SLIs: the most) and evaluations counted, or its total rate summed."""
    mine = f'{{{SLO_LABEL}="{sli.slo.value}"}}'
    bad = Tiled(sli_bad_record(plan.base) + mine, Agg.SUM)
    if sli.time_based:
        return bad, ranks(sli.slo.value, plan), counter(sli.slo.value)
    return bad, Tiled(sli_total_record(plan.base) + mine, Agg.SUM)


def window_rules(sli: Sli, objective: Objective, plan: Plan, *, period: bool = False) -> list[Rule]:
    """Error ratios, burn rates, from the job-level rates alone (``tiers.Tier.GLOBAL``): over every
    window but the period and the tiles they read, or (``period``) over the period and the budget
    left, in a group of their own (``period_group``). A window up to the tile reads the rates
    directly; a longer one, from the tiles (``alerts/tiles.py``), over one evaluation more than the
    window, as a range does on Prometheus 2 (``[a, b]``): the same samples, and the same ratios."""
    *spans, whole = plan.windows
    base, e = spans[0], plan.evaluation_interval
    mine = f'{{{SLO_LABEL}="{sli.slo.value}"}}'
    bad, total = sli_bad_record(base) + mine, sli_total_record(base) + mine
    tiled = _tiled(sli, plan)
    windows = [whole] if period else spans[1:]
    rules = [] if period else [rule for t in tiled for rule in t.rules(plan)]

    def over(t: Tiled, w: int) -> str:
        if w <= plan.tile:
            return f"{t.agg.value}_over_time({t.selector}[{duration.format(w)}])"
        return t.settled(w + e, plan) if period else t.window(w + e, plan)

    if sli.time_based:  # bad rank-seconds over (the most ranks the window saw × the whole window)
        def integral(w: int) -> str:  # the mean over the window's evaluations, none before the job: 0
            span = None if w <= plan.tile else w + e
            counted = evaluations(sli.slo.value, w, plan, span=span, settled=period)
            return f"({over(tiled[0], w)} / {counted})"

        if not period:
            rules.append(_record(error_ratio_record(base), _ratio(bad, over(tiled[1], base)), sli))
        rules += [_record(error_ratio_record(w), _ratio(integral(w), over(tiled[1], w)), sli) for w in windows]
    else:  # bad events over events
        if not period:
            rules.append(_record(error_ratio_record(base), _ratio(bad, total), sli))
        rules += [_record(error_ratio_record(w), _ratio(over(tiled[0], w), over(tiled[1], w)), sli)
                  for w in windows]
    rules += [_record(burn_rate_record(w), f"{error_ratio_record(w)}{mine} / {objective.budget:g}", sli)
              for w in ([whole] if period else spans)]
    if period:
        rules.append(_record(ERROR_BUDGET_REMAINING, f"1 - {burn_rate_record(whole)}{mine}", sli))
    return rules


def _pair(window: BurnWindow, mine: str) -> str:
    return (
        f"(\n  {burn_rate_record(window.long)}{mine} > {window.factor:g}\nand\n"
        f"  {burn_rate_record(window.short)}{mine} > {window.factor:g}\n)"
    )


def _describe(pairs: list[BurnWindow]) -> str:
    return " or ".join(
        f"{p.factor:g}× over {duration.format(p.long)} and {duration.format(p.short)}" for p in pairs
    )


def burn_alert(sli: Sli, objective: Objective, spec: Spec, plan: Plan, severity: Severity) -> Rule:
    """The page (critical) or ticket (warning) rule of one SLO; a ticket-only SLO tickets on every pair."""
    pairs = [w for w in plan.burn_windows if w.severity is severity or not objective.page]
    mine = f'{{{SLO_LABEL}="{sli.slo.value}"}}'
    pace = "fast" if severity is Severity.PAGE else "steadily"
    rule = {
        "alert": BURN_ALERTS[sli.slo].value,
        "expr": "\nor\n".join(_pair(p, mine) for p in pairs),
        "labels": {SEVERITY_LABEL: severity.value, SLO_LABEL: sli.slo.value},
        "annotations": {
            "summary": f"A training job is burning its {sli.title} error budget {pace}.",
            "description": (
                "{{ $labels.namespace }}/{{ $labels.job_name }} spends its " + sli.title
                + " error budget {{ printf \"%.1f\" $value }}× as fast as the objective allows ("
                + f"{sli.objective_text(objective.target)} over {duration.format(plan.period)}). "
                + f"This alert fires at {_describe(pairs)}."
            ),
        },
    }
    return stamp_links(rule, spec)


def group_name(sli: Sli) -> str:
    return f"nvrx-slo-{sli.slo.value.replace('_', '-')}"


def slo_group(sli: Sli, spec: Spec, plan: Plan) -> Group:
    objective = spec.objectives[sli.slo]
    severities = [Severity.PAGE, Severity.TICKET] if objective.page else [Severity.TICKET]
    alerts = [burn_alert(sli, objective, spec, plan, s) for s in severities]
    return Group(group_name(sli), plan.evaluation_interval,
                 (*tiered(Tier.LOCAL, job_rates(sli, plan)),
                  *tiered(Tier.GLOBAL, window_rules(sli, objective, plan) + alerts)))


def slo_period_group(sli: Sli, spec: Spec, plan: Plan) -> Group:
    """The SLO's ratio over the period and its budget left, every ``plan.period_interval``: a window
    of 43,200 evaluations need not move at each (``Tiled.settled``). No alert reads them."""
    return period_group(group_name(sli), plan, window_rules(sli, spec.objectives[sli.slo], plan, period=True))

