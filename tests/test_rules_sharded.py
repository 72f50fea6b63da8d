"""The rules for more than one Prometheus (docs/scaling.md): the two tiers the generator writes apart.

The fast tests check the split itself on the generated files: each group's rules in the one-Prometheus
file are its local rules and its global rules, in order; no local rule reads what a global rule
records (so the local file alone records what the one Prometheus records); the global rules read no
series of the pods, only job-level records of the local tier (the names a local Prometheus must
send on, matched by the one regex the plan gives).

The slow test runs the split for real: three Prometheus servers on loopback (Debian's 2.42 here,
2.53 on Debian 13), scraping the demo run the session shares (``tests/fleet.py``).

* *single*: scrapes the sidecars of a real demo job (two pods, one lost at step 15 and replaced 8 s
  later, as in tests/test_pods_prometheus.py) and runs the one-Prometheus file, both tiers, as one
  Prometheus would. As the local tier of a fleet it also remote-writes the job-level records the
  global tier reads, with external label ``cluster="a"``; what it sends is what its local rules
  recorded, and those read nothing of the global tier (above), so it is what a Prometheus running
  the local file alone would send.
* *idle shard*: the local file alone, with ``cluster="b"`` and nothing to scrape, remote-writing
  too: a second shard, whose evaluation counters reach the global ruler beside the first's.
* *global*: the global file over what it receives (``--web.enable-remote-write-receiver``),
  scraping nothing, as a Thanos or Mimir ruler would.

Once the job has ended and every sample has arrived, the global's SLIs over the SLO period (each
SLO's error ratio and budget left, and the period-long derived signals) equal the single's: both
sum the very same recorded samples over a period longer than the run, in the same order, so the
tolerance is float rounding (1e-9 relative), not a sampling error. Shorter windows are compared
only for what they decide: the single paged for the node loss, and so did the global ruler.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from backends import query
from fleet import JOB_LEVEL, Fleet, groups, reads, recorded
from nvrx_slo.alerts import files as alert_files
from nvrx_slo.alerts import spec
from nvrx_slo.alerts.conventions import (
    ERROR_BUDGET_REMAINING,
    EVALUATIONS,
    Alert,
    Signal,
    error_ratio_record,
    over_period,
)


@pytest.fixture(scope="module")
def files() -> dict[str, dict[str, list[dict[str, Any]]]]:
    s = spec.load()
    rendered = alert_files.render(s, s.plan(), "test")
    return {"single": groups(rendered[alert_files.RULES]), "local": groups(rendered[alert_files.LOCAL_RULES]),
            "global": groups(rendered[alert_files.GLOBAL_RULES])}


def test_each_group_is_its_local_rules_then_its_global_rules_in_order(files):
    assert set(files["local"]) | set(files["global"]) == set(files["single"])
    for name, rules in files["single"].items():
        local, global_ = files["local"].get(name, []), files["global"].get(name, [])
        assert [r for r in rules if r in local] == local and [r for r in rules if r in global_] == global_, name
        assert len(local) + len(global_) == len(rules), name


def test_the_local_tier_reads_nothing_the_global_tier_records(files):
    from_global = recorded(files["global"])
    for name, rules in files["local"].items():
        for rule in rules:
            assert not reads(rule) & from_global, (name, rule.get("record") or rule.get("alert"))


def _read_now(rule: dict[str, Any], names: set[str]) -> set[str]:
    """The names of ``names`` that ``rule`` reads at its own evaluation: anywhere not under an ``offset``."""
    expr = re.sub(r"\s+", " ", rule["expr"])
    read = r"(?![\w:])(?:\{[^}]*\})?(?:\[[^\]]*\])?( offset \w+)?"  # the name whole, its labels, range, offset
    return {n for n in reads(rule) & names if any(not m[1] for m in re.finditer(re.escape(n) + read, expr))}


def test_every_increment_and_what_it_reads_is_computed_from_the_pods_series_and_evaluations_before(files):
    """vmalert writes what it records asynchronously (docs/scaling.md): a rule reading a record of its
    own evaluation reads the one before, or nothing, and an increment read so loses or repeats a
    burst. So each ``…:increase`` record, and each record it reads, reads records only at an offset."""
    from_local = recorded(files["local"])
    rules = {r["record"]: r for rs in files["local"].values() for r in rs if "record" in r}
    increments = [n for n in rules if n.endswith(":increase")]
    assert len(increments) == 5, increments  # the SLI's badput; accelerator-seconds and money by category and cause
    for name in increments + sorted(set().union(*(reads(rules[n]) & from_local for n in increments))):
        assert not _read_now(rules[name], from_local), (name, _read_now(rules[name], from_local))


def test_the_global_tier_reads_only_job_level_records_of_the_local_tier(files):
    """... and its own: what its group recorded earlier in this evaluation, and any global record of
    evaluations before (the tiles' partials, ``alerts/tiles.py``, read at an offset). A group over the
    period (``-period``) reads the tiles' records as their group made them last (``Tiled.settled``),
    and no other group's record but those."""
    from_local, from_global = recorded(files["local"]), recorded(files["global"])
    tiles = {n for n in from_global if re.search(r"_tile\w+?(_partial|_head)?$", n)}
    assert {n for n in tiles if n.endswith("_head")}, "no head: the period's groups read none"
    for name, rules in files["global"].items():
        before: set[str] = set()  # a global rule may read a global record its group recorded earlier
        settled = tiles if name.endswith("-period") else set()
        for rule in rules:
            foreign = reads(rule) - before - settled - {n for n in from_local if JOB_LEVEL.fullmatch(n)}
            assert not _read_now(rule, foreign), (name, rule.get("record") or rule.get("alert"), foreign)
            assert foreign <= from_global, (name, rule.get("record") or rule.get("alert"), foreign)
            before |= {rule["record"]} if "record" in rule else set()


def test_the_global_tier_tells_jobs_apart_by_all_their_labels(files):
    """A global ruler sees each shard's records with its external labels: a join on the job's labels
    alone would drop them from the SLIs and alerts, and fail on a job name two shards share (``on ()``,
    a join with one number, joins on nothing)."""
    for name, rules in files["global"].items():
        for rule in rules:
            assert not re.search(r"\bon \((?!\))", rule["expr"]), (name, rule.get("record") or rule.get("alert"))


# --- the split, run for real ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet(node_loss_fleet: Fleet) -> dict[str, Any]:
    """The session's node-loss demo as the two tiers of Prometheus saw it (``tests/fleet.py``)."""
    f = node_loss_fleet
    return {"single": f.single, "global": f.global_, "returncode": f.returncode, "interface": f.interface,
            "stderr": f.stderr, "spec": f.spec}


def _by_series(result: list[dict[str, Any]]) -> dict[tuple[tuple[str, str], ...], float]:
    """Values keyed by labels, without the shard's external label (only the global ruler's have it)."""
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k != "cluster")): float(r["value"][1])
            for r in result}


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.nvrx
@pytest.mark.external
def test_the_global_rulers_slis_over_the_period_equal_one_prometheuss(fleet):
    assert fleet["returncode"] == 0, fleet["stderr"][-3000:]
    s = fleet["spec"]
    names = [error_ratio_record(s.period), ERROR_BUDGET_REMAINING] + [
        over_period(m, s.plan()) for m in (Signal.OVERLAP, Signal.COST, Signal.MTBF, Signal.RESTART_COST,
                                           Signal.INTERVAL)]
    expr = f'{{__name__=~"{"|".join(re.escape(n) for n in names)}"}}'
    single, ruler = (query(fleet[p], expr) for p in ("single", "global"))
    # the shard's label survives to the job's SLIs
    assert {r["metric"].get("cluster") for r in ruler} == {"a"}, [r["metric"] for r in ruler]
    # both shards' evaluation counters reached the ruler: its windows divide by the most either counted
    counters = query(fleet["global"], f'count by (cluster) ({{__name__="{EVALUATIONS}", slo="efficiency"}})')
    assert {r["metric"]["cluster"] for r in counters} == {"a", "b"}
    assert {r["metric"].get("slo") for r in single if r["metric"]["__name__"] in names[:2]} >= {
        "efficiency", "recovery", "checkpoint_blocking", "checkpoint_overlap"}
    expected, got = _by_series(single), _by_series(ruler)
    print(f"\n{len(expected)} period-long series; interface: {len(fleet['interface'])} job-level records")
    for key, value in sorted(expected.items()):
        print(f"  {dict(key)['__name__']}{{slo={dict(key).get('slo', '')}}}: single {value:.6g}, "
              f"global {got.get(key, float('nan')):.6g}")
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), dict(key)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.nvrx
@pytest.mark.external
def test_the_node_loss_paged_from_the_global_ruler_as_from_one_prometheus(fleet):
    assert fleet["returncode"] == 0, fleet["stderr"][-3000:]
    page = f'max_over_time(ALERTS{{alertname="{Alert.EFFICIENCY_BURN.value}", alertstate="firing", ' \
           f'severity="critical"}}[1h])'
    assert query(fleet["single"], page), "the single Prometheus did not page: nothing to compare"
    assert query(fleet["global"], page)
