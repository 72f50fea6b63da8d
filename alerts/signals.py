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
from nvrx_slo.alerts.conventions import SLO_LABEL, Signal, over_period, ranks, signal_rate
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.sli import busiest_pod_rate, job_rate
from nvrx_slo.alerts.spec import Slo
from nvrx_slo.alerts.tiers import Group, Tier, period_group, tiered
from nvrx_slo.alerts.tiles import Agg, Tiled
from nvrx_slo.contracts import catalogue as cat

Rule = dict[str, Any]
# The signals recorded as the job's rates over the shortest window; the others are over the period.
RATES = (Signal.BLOCKING, Signal.BACKGROUND, Signal.RANK_SAVES, Signal.RESTARTS, Signal.RESTART_SECONDS)


def records(plan: Plan) -> tuple[list[tuple[Tier, Rule]], list[Rule]]:
    """The rules, in evaluation order (each reads the ones before it at this evaluation): the rates
    read the pods' series (``Tier.LOCAL``), and their tiles (``alerts/tiles.py``); then the period's
    signals, which read only those (``Tier.GLOBAL``)."""
    w, every = duration.format(plan.base), plan.evaluation_interval
    span = plan.period + every  # as a range of the period holds, on Prometheus 2 ([a, b]): alerts/rules.py

    def rate(signal: Signal) -> str:
        return signal_rate(signal, plan)

    def over(signal: Signal) -> str:
        return over_period(signal, plan)

    summed = {signal: Tiled(rate(signal), Agg.SUM) for signal in RATES}
    counted = Tiled(rate(Signal.BLOCKING), Agg.COUNT)  # evaluations: × interval = seconds

    def total(signal: Signal) -> str:
        return summed[signal].settled(span, plan)

    elapsed = counted.settled(span, plan)
    world = ranks(Slo.EFFICIENCY.value, plan).settled(span, plan)  # the job's most ranks: the efficiency group's tiles
    restart_seconds = f"{cat.RESTART_DURATION.name}_sum"
    rates = [
        (rate(Signal.BLOCKING), job_rate(f"{cat.CKPT_BLOCKING.name}_sum", w)),
        (rate(Signal.BACKGROUND), job_rate(f"{cat.CKPT_BACKGROUND.name}_sum", w)),
        (rate(Signal.RANK_SAVES), job_rate(f"{cat.CKPT_BLOCKING.name}_count", w)),
        (rate(Signal.RESTARTS), busiest_pod_rate(f"{cat.RESTART_DURATION.name}_count", w)),
        (rate(Signal.RESTART_SECONDS), busiest_pod_rate(restart_seconds, w)),
    ]
    blocking, background, saves = total(Signal.BLOCKING), total(Signal.BACKGROUND), total(Signal.RANK_SAVES)
    restarts = total(Signal.RESTARTS)
    cost, interval, mtbf, restart_cost = (over(s) for s in (Signal.COST, Signal.INTERVAL, Signal.MTBF,
                                                            Signal.RESTART_COST))
    signals = [
        (over(Signal.OVERLAP), f"{background}\n/\n(({blocking} + {background}) > 0)"),
        (cost, f"{blocking}\n/\n({saves} > 0)"),
        (interval, f"{elapsed} * {every}\n/\n"
                   f"({saves} * {every} / ignoring ({SLO_LABEL}) {world} > 0)"),
        (mtbf, f"{elapsed}\n/\n({restarts} > 0)"),
        (restart_cost, f"{total(Signal.RESTART_SECONDS)}\n/\n({restarts} > 0)"),
        (over(Signal.OPTIMAL), f"sqrt(2 * {cost} * {mtbf})"),
        # ETTR ≈ (1 − (u₀ + Δt/2) / MTBF) / (1 + C/Δt); no fault yet: the checkpoint term alone
        (over(Signal.PREDICTED), f"clamp(\n  (1 - ((({restart_cost} or 0 * {interval}) + {interval} / 2)"
                                 f" / {mtbf}\n        or 0 * {interval}))\n"
                                 f"  / (1 + {cost} / {interval}),\n  0, 1)"),
    ]
    tiles = [rule for tiled in (*summed.values(), counted) for rule in tiled.rules(plan)]
    return ([*tiered(Tier.LOCAL, ({"record": name, "expr": expr} for name, expr in rates)),
             *tiered(Tier.GLOBAL, tiles)], [{"record": name, "expr": expr} for name, expr in signals])


NAME = "nvrx-slo-signals"


def signals_groups(plan: Plan) -> tuple[Group, Group]:
    """The rates and their tiles, every evaluation; the signals over the period from them, in a group
    of their own every ``plan.period_interval`` (``rules.period_group``)."""
    every, period = records(plan)
    return Group(NAME, plan.evaluation_interval, tuple(every)), period_group(NAME, plan, period)
