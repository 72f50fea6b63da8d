"""The generated rules on VictoriaMetrics (vmagent, vmalert, single-node storage) beside Prometheus,
over the session's two-pod node-loss demo (``tests/fleet.py`` starts every server; docs/scaling.md
says what differs between the two and why).

Both run the rules for the same spec (15 s evaluations, a 30 s shortest window, a 12 h period):
Prometheus the one-Prometheus file (*reference*); VictoriaMetrics the two tiers apart, on one
storage (*one*) and across two (*global*, fed by vmagent remote-write). What is compared, after the
job has ended and every tier has evaluated its end:

* the efficiency SLI: the bad rank-seconds it recorded over the run, and its parts, the absent
  rank-seconds and each target's badput increments (which add up to what the pods' counters read,
  each target from 0: a new pod's first evaluation counts all its counters hold);
* the error budget left and the error ratio over the SLO period, and the shortest window's burn rate
  summed over the run (the longer windows average the recorded rates it is made of);
* what badput cost, in accelerator-seconds by category and by cause (alerts/cost.py), summed over
  the run;
* the node-loss page: Prometheus fired it, and Alertmanager paged it from both VictoriaMetrics tiers;
* the global tier against the one storage: its SLIs over the period are the same samples, summed.

Each agrees within one evaluation interval of the job's work (world size × 15 s of rank-seconds):
the two evaluate at different instants, so each end of a stretch (a pod absent, a burst of settled
badput) may fall an evaluation apart.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from backends import query
from fleet import Fleet
from needs import tool
from nvrx_slo.alerts.conventions import (
    ABSENT_RANKS,
    BADPUT_INCREASE,
    CATEGORY_LABEL,
    CAUSE_LABEL,
    ERROR_BUDGET_REMAINING,
    EVALUATIONS,
    VANISHED_AT_RISK,
    Alert,
    CostOf,
    Signal,
    burn_rate_record,
    cost_increase,
    error_ratio_record,
    over_period,
    sli_bad_record,
    sli_total_record,
)
from nvrx_slo.contracts.catalogue import (
    BADPUT_CATEGORIES,
    FAULT_TIME,
    RANK_ACCELERATORS,
    TIME,
    Category,
    FaultCause,
)

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.nvrx, pytest.mark.external]

EFFICIENCY = '{slo="efficiency"}'


@pytest.fixture(scope="module")
def vm(node_loss_fleet: Fleet) -> Fleet:
    for name in ("victoria-metrics", "vmagent", "vmalert"):
        tool(name)
    assert node_loss_fleet.returncode == 0, node_loss_fleet.stderr[-3000:]
    assert node_loss_fleet.vm is not None
    return node_loss_fleet


def _one(url: str, expr: str) -> float:
    (result,) = query(url, expr)
    return float(result["value"][1])


def _work(vm: Fleet) -> tuple[float, float]:
    """The job's world size and one evaluation interval of its work, in rank-seconds."""
    base = vm.vm_spec.plan().base
    world = _one(vm.vm["reference"], f"max_over_time({sli_total_record(base)}{EFFICIENCY}[1h])")
    return world, world * vm.vm_spec.evaluation_interval


def test_the_efficiency_sli_and_the_absent_ranks_agree_with_prometheus(vm: Fleet) -> None:
    world, work = _work(vm)
    interval, base = vm.vm_spec.evaluation_interval, vm.vm_spec.plan().base
    badput = "|".join(c.value for c in BADPUT_CATEGORIES)
    measured: dict[str, dict[str, float]] = {}
    for name in ("reference", "one"):
        url = vm.vm[name]
        measured[name] = {
            "bad": _one(url, f"sum_over_time({sli_bad_record(base)}{EFFICIENCY}[1h])") * interval,
            "absent": _one(url, f"sum_over_time({ABSENT_RANKS}[1h])") * interval,
            "increments": _one(url, f"sum_over_time({BADPUT_INCREASE}[1h])"),
            "counters": _one(url, f'sum(last_over_time({TIME.name}{{category=~"{badput}"}}[1h]))'),
        }
    print(f"\nworld {world:g}, one evaluation of work {work:g} rank-s; " + "; ".join(
        f"{n}: " + ", ".join(f"{k} {v:.2f}" for k, v in m.items()) for n, m in measured.items()))
    prom, victoria = measured["reference"], measured["one"]
    # each rule reads what the previous evaluation recorded, and a new target counts from 0: on both,
    # the increments add up to the counters exactly, the replacement pod's init before its first
    # evaluation included (alerts/sli.py ``increase``)
    assert victoria["increments"] == pytest.approx(victoria["counters"], abs=0.01)
    assert prom["increments"] == pytest.approx(prom["counters"], abs=0.01)
    assert prom["bad"] > work  # the node loss and the restarts were badput: something to compare
    for part in ("bad", "absent", "increments"):
        assert abs(victoria[part] - prom[part]) <= work, (part, victoria[part], prom[part], work)


def _at_end(vm: Fleet, url: str, record: str) -> float:
    return _one(url, f"{record}{EFFICIENCY}")


def test_the_budget_and_the_burn_rates_agree_with_prometheus(vm: Fleet) -> None:
    world, work = _work(vm)
    plan = vm.vm_spec.plan()
    period = plan.period
    ratio = {n: _at_end(vm, vm.vm[n], error_ratio_record(period)) for n in ("reference", "one")}
    left = {n: _at_end(vm, vm.vm[n], ERROR_BUDGET_REMAINING) for n in ("reference", "one")}
    # one evaluation of work over the period's rank-seconds, as a ratio and as budget (1% of it)
    tolerance = work / (world * period)
    print(f"\nerror ratio over {period} s: {ratio}; budget left: {left}")
    assert abs(ratio["one"] - ratio["reference"]) <= tolerance
    assert abs(left["one"] - left["reference"]) <= tolerance / 0.01
    # the shortest window's burn rate, each evaluation's summed over the run: the SLI's bad rank-seconds
    # over the job's ranks, as budget (the longer windows average the same recorded rates)
    burnt = {n: _one(vm.vm[n], f"sum_over_time({burn_rate_record(plan.base)}{EFFICIENCY}[1h])")
             * vm.vm_spec.evaluation_interval for n in ("reference", "one")}
    print(f"  burn rate over {plan.base} s, summed over the run (burn-seconds): {burnt}")
    assert abs(burnt["one"] - burnt["reference"]) <= work / world / 0.01


def test_badput_by_category_and_by_cause_costs_what_prometheus_records(vm: Fleet) -> None:
    """The cost rules' increments, accelerator-seconds, each label value summed over the run. Their
    fault seconds and badput are each target's counters now less its record an evaluation ago: read
    back from vmalert's own evaluation, an increment loses or repeats a burst. So on VictoriaMetrics
    they add up exactly to what the pods' counters say, × the accelerators per rank, besides what no
    pod accounted (the absent ranks, a vanished pod's work at risk: ``pod_lost``), as the SLI's
    increments do; and each label value agrees with Prometheus's within one evaluation of work."""
    _, work = _work(vm)
    url = vm.vm["one"]
    per_rank = _one(url, f"max(max_over_time({RANK_ACCELERATORS.name}[1h]))")
    absent = _one(url, f"sum_over_time({ABSENT_RANKS}[1h])") * vm.vm_spec.evaluation_interval
    vanished = _one(url, f"sum(sum_over_time({VANISHED_AT_RISK}[1h])) or vector(0)")
    badput = "|".join(c.value for c in BADPUT_CATEGORIES)
    # what the pods' counters hold (a vanished pod's work at risk is lost, with its own lost seconds),
    # and the label value of what no pod accounted
    pods = {CostOf.CATEGORY: (f'{TIME.name}{{category=~"{badput}"}}', vanished, Category.ABSENT.value, absent),
            CostOf.CAUSE: (FAULT_TIME.name, 0.0, FaultCause.POD_LOST.value, absent + vanished)}
    for of, label in ((CostOf.CATEGORY, CATEGORY_LABEL), (CostOf.CAUSE, CAUSE_LABEL)):
        expr = f"sum by ({label}) (sum_over_time({cost_increase(of, False)}[1h]))"
        got = {n: {r["metric"][label]: float(r["value"][1]) for r in query(vm.vm[n], expr)}
               for n in ("reference", "one")}
        counters, more, gone, unaccounted = pods[of]
        held = _one(url, f"sum(last_over_time({counters}[1h]))")
        print(f"\naccelerator-seconds by {label}: {got}; VictoriaMetrics: counters {held:.2f} and {more:.2f} rank-s, "
              f"{gone} {unaccounted:.2f} rank-s, {per_rank:g} accelerators per rank")
        # the restarts cost something; the node loss may not on Prometheus: its 10 s absence can fall
        # between two 15 s evaluations, and by cause the restarts alone are under one evaluation of work
        assert sum(got["reference"].values()) > 0, got
        victoria = got["one"]
        accounted = sum(v for k, v in victoria.items() if k != gone)
        assert accounted == pytest.approx(per_rank * (held + more), abs=0.01), (of, accounted, held + more)
        assert victoria.get(gone, 0.0) == pytest.approx(per_rank * unaccounted, abs=0.01), (of, gone)
        assert set(victoria) == set(got["reference"]), got
        for value, seconds in got["reference"].items():
            assert abs(victoria[value] - seconds) <= work, (label, value, got)


def test_the_node_loss_pages_from_both_victoriametrics_tiers_through_alertmanager(vm: Fleet) -> None:
    page = f'max_over_time(ALERTS{{alertname="{Alert.EFFICIENCY_BURN.value}", alertstate="firing", ' \
           f'severity="critical"}}[1h])'
    assert query(vm.vm["reference"], page), "Prometheus did not page: nothing to compare"
    paged = {a["labels"].get("cluster", "one") for n in vm.pages for a in n["alerts"]
             if a["labels"]["alertname"] == Alert.EFFICIENCY_BURN.value and a["labels"]["severity"] == "critical"
             and a["status"] == "firing" and a["labels"]["job_name"] == "demo"}
    assert paged == {"one", "a"}, paged  # the one storage's global tier, and the global ruler (shard a's labels)


def _by_series(result: list[dict[str, Any]]) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k != "cluster")): float(r["value"][1])
            for r in result}


def test_the_global_tier_on_victoriametrics_sums_what_the_shard_recorded(vm: Fleet) -> None:
    """The global storage holds shard a's job-level records (relayed by vmagent, ``cluster="a"``)
    and the idle shard's counters: its SLIs over the period are the one storage's, to float rounding."""
    s = vm.vm_spec
    names = [error_ratio_record(s.period), ERROR_BUDGET_REMAINING] + [
        over_period(m, s.plan()) for m in (Signal.OVERLAP, Signal.COST, Signal.MTBF, Signal.RESTART_COST,
                                           Signal.INTERVAL)]
    expr = f'{{__name__=~"{"|".join(re.escape(n) for n in names)}"}}'
    one, ruler = (query(vm.vm[p], expr) for p in ("one", "global"))
    assert {r["metric"].get("cluster") for r in ruler} == {"a"}, [r["metric"] for r in ruler]
    counters = query(vm.vm["global"], f'count by (cluster) ({{__name__="{EVALUATIONS}", slo="efficiency"}})')
    assert {r["metric"]["cluster"] for r in counters} == {"a", "b"}
    expected, got = _by_series(one), _by_series(ruler)
    assert {dict(k).get("slo") for k in expected if dict(k)["__name__"] in names[:2]} >= {
        "efficiency", "recovery", "checkpoint_blocking", "checkpoint_overlap"}
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), dict(key)
