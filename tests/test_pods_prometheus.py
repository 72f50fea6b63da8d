"""A job of two pods, and one of four, with a node loss, through a real Prometheus running the
generated rules.

All real: ``nvrx-slo demo --pods N --node-loss 1`` (N ft_launcher agents in one c10d rendezvous,
one gloo rank and one sidecar per pod; pod 1 and its sidecar SIGKILLed at step 15, a replacement
pod and sidecar started 8 s later) → Prometheus 2.42 discovering each sidecar as the demo starts it
(file service discovery, as a PodMonitor would), 1 s scrapes and evaluations, with the rules
``nvrx-slo generate`` writes for a three-hour SLO period (windows scaled 1,080× down, the shortest
10 s: several scrapes, so ``rate()``'s edges lose little of a counter's jump).

Checked against the demo's own job report, which ``tests/test_demo_pods.py`` checks against the
raw journals and the harness's kill instant: the rank-seconds Prometheus counted absent, and one
restart for the one fault (each pod records it; the recovery SLI counts the pod that counted most),
with no restart storm. And against the raw journals: the job's error ratio, the lost pod's work
since its last save included (its sidecar died with it; the rules count what it last put at risk).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from backends import query
from dashboard_model import queries as dashboard_queries
from journal_truth import read_journal
from needs import tool
from nvrx_slo.alerts import files as alert_files
from nvrx_slo.alerts import spec
from nvrx_slo.alerts.conventions import (
    ABSENT_RANKS,
    BADPUT_INCREASE,
    VANISHED_AT_RISK,
    Alert,
    CostOf,
    Dashboard,
    PriceSource,
    cost_increase,
    sli_bad_record,
    sli_total_record,
)
from nvrx_slo.contracts.catalogue import (
    BADPUT_CATEGORIES,
    CKPT_LAST_STEP,
    LAST_STEP_TIMESTAMP,
    TIME,
    Category,
    FaultCause,
)
from nvrx_slo.dashboards import files as dashboard_files
from nvrx_slo.dashboards import fleet
from nvrx_slo.dashboards.queries import NAMESPACE_ALL_VALUE
from nvrx_slo.exporter import state_store
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.generate import main as generate_main
from servers import start_prometheus, stop, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.nvrx, pytest.mark.external]

_SIDECAR = re.compile(r"^sidecar of (\S+): http://(127\.0\.0\.1:\d+)/ \(status page\)", re.M)


def _ready(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=1) as resp:
        return resp.status == 200


# Seconds after the job's end by which the SLI holds all of it: a bad instant reaches the absent-rank
# record a shortest window (10 s) later (ranks are recorded as they stood then), and the SLI's rate
# averages a shortest window of that record; an evaluation interval (1 s) each for the two rounds.
SETTLED = 2 * 10 + 2 * 1


def _spec_data() -> dict[str, Any]:
    """The default spec for a three-hour period, evaluated every second."""
    data = yaml.safe_load(spec.DEFAULT_PATH.read_text())
    data.update(period="3h", min_window="10s", evaluation_interval="1s")
    return data


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}pods")
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    pods: int = request.param
    tmp = tmp_path_factory.mktemp(f"pods-prometheus-{pods}")
    (tmp / "slo.yaml").write_text(yaml.safe_dump(_spec_data()))
    assert generate_main(["alerts", "--spec", str(tmp / "slo.yaml"), "--root", str(tmp)]) == 0
    targets = tmp / "targets.json"
    targets.write_text("[]")
    config = tmp / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / alert_files.RULES)],
        "scrape_configs": [{"job_name": "nvrx-slo", "honor_labels": True,
                            "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]}],
    }))
    prometheus, url = start_prometheus(tool("prometheus"), config, tmp)
    try:
        wait_for(lambda: _ready(f"{url}/-/ready"), "Prometheus ready", 30)
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        errors = tmp / "demo.stderr"
        demo = subprocess.Popen(
            [sys.executable, "-m", "nvrx_slo", "demo", "--pods", str(pods), "--node-loss", "1", "--replace-after", "8",
             "--final-scrape-timeout", "10", "--run-dir", str(tmp / "run")],
            stdout=subprocess.PIPE, stderr=open(errors, "wb"), text=True, env=env)
        out: list[str] = []
        sidecars: dict[str, str] = {}

        def follow() -> None:  # each sidecar becomes a scrape target as the demo starts it
            assert demo.stdout is not None
            for line in demo.stdout:
                out.append(line)
                if match := _SIDECAR.match(line):
                    sidecars[Path(match.group(1)).parent.name] = match.group(2)
                    seen = json.loads(targets.read_text())
                    seen.append({"targets": [match.group(2)]})
                    tmp_targets = targets.with_suffix(".tmp")
                    tmp_targets.write_text(json.dumps(seen))
                    tmp_targets.replace(targets)

        reader = threading.Thread(target=follow, daemon=True)
        reader.start()
        demo.wait(timeout=600)
        ended = time.time()  # every pod and every sidecar gone: the job, as a Kubernetes Job, has ended
        reader.join(timeout=10)
        stderr = errors.read_text(errors="replace")
        # the SLI's last evaluations after the last scrapes (``SETTLED``), then a few more in which
        # nothing may be added
        time.sleep(max(0.0, ended + SETTLED + 8 - time.time()))
        yield {"prometheus": url, "stdout": "".join(out), "stderr": stderr, "returncode": demo.returncode,
               "spec": spec.load(tmp / "slo.yaml"), "run_dir": tmp / "run", "pods": pods, "ended": ended,
               "targets": sidecars}
    finally:
        stop(prometheus)


def test_prometheus_counts_the_lost_pods_rank_absent_as_the_job_report_does(run):
    """Both count the lost rank absent from the loss until the replacement pod runs it, from its
    launcher's start (the rules count a pod Prometheus first scraped later from its origin), so the
    replacement's start-up is its rank's init, not absent as well. Ground truth: the raw journals'
    instants (the lost pod's last record, the replacement launcher's), counted at the evaluations
    that recorded absent ranks, as the rules sample them (each end of a stretch rounded to the 1 s
    evaluations). An evaluation before any pod has said the job's world size records none: its
    ranks still starting more than a shortest window (10 s here) after the first launcher, the
    other pods' few seconds of joining went unrecorded once on a clean clone (9 rank-s recorded
    against the report's 12.02). The upper bound also leaves each joining launcher's time to its
    next record (its start record is written after its imports); the lower bound, the time until a
    scrape found the lost pod gone, beyond one interval (Prometheus's ``up``: the rules count the pod
    running until then; a run under .ci/run recorded 12 rank-s against 14.96 rounded)."""
    assert run["returncode"] == 0, run["stderr"][-3000:]
    report = run["stdout"].split("nvrx-slo SLO report — ")[1]
    absent = float(re.search(r"^  absent \(no pod ran the rank\)\s+([\d.]+) s", report, re.M).group(1))
    lost = read_journal(run["run_dir"] / "pod-1" / "journal")  # killed as it journaled step 15 (a poll, 0.2 s)
    launcher = min((r for r in read_journal(run["run_dir"] / "pod-1-replacement" / "journal") if r["rank"] is None),
                   key=lambda r: r["seq"])
    gone = launcher["mono"] - max(r["mono"] for r in lost)
    unread = _unread(run["run_dir"])
    assert absent >= gone >= 8.0, (absent, gone)
    # the evaluations at which the job's world size exceeded the ranks its pods ran, 1 s each
    (recorded,) = query(run["prometheus"], f"sum_over_time({ABSENT_RANKS}[1h])")
    seconds = float(recorded["value"][1])
    (samples,) = query(run["prometheus"], f"{ABSENT_RANKS}[1h]")
    base, interval = run["spec"].plan().base, run["spec"].evaluation_interval
    rounded = absent + _absent_rounding(run["run_dir"], [float(t) for t, _ in samples["values"]], base, interval)
    print(f"\n{run['pods']} pods: absent {seconds:.0f} rank-s recorded, {absent:.2f} in the report, {rounded:.2f}"
          f" with each stretch's ends rounded to the evaluations; {unread:.2f} s unread")
    # a scrape (1 s) and the demo's poll of the lost pod's journal (0.2 s) either way at the loss, and
    # late by as long as the pod was not yet found gone (the rules count it running until a scrape
    # fails); early by the launchers' time to their next record
    last = max(r["wall"] for r in lost)
    late = max(0.0, _found_gone(run, last, run["ended"] + SETTLED) - last - interval)
    assert rounded - interval - 0.5 - late <= seconds <= rounded + unread + interval + 0.5, (
        seconds, rounded, absent, unread, late)
    assert seconds >= 8.0  # the replacement came 8 s after the loss
    world = query(run["prometheus"], f'max_over_time({sli_total_record(base)}{{slo="efficiency"}}[1h])')
    assert [float(w["value"][1]) for w in world] == [run["pods"]]  # the job's world size, not its live ranks


def test_one_fault_is_one_restart_at_job_level_and_no_storm(run):
    """The survivor restarts in-job for the replacement's rendezvous; the lost pod recorded nothing
    and the replacement's first process is no restart: the SLI counts one restart."""
    assert run["returncode"] == 0, run["stderr"][-3000:]
    base = run["spec"].plan().base
    total = f'{sli_total_record(base)}{{slo="recovery"}}'
    per_pod = query(run["prometheus"], "sum by (pod) (max_over_time(nvrx_restarts_total[1h]))")
    survivors = {f"pod-{i}": 1.0 for i in range(run["pods"]) if i != 1}
    assert {p["metric"]["pod"]: float(p["value"][1]) for p in per_pod} == {
        **survivors, "pod-1": 0.0, "pod-1-replacement": 0.0}
    # each evaluation's restart rate over the shortest window, summed over the run: 10 s windows at
    # 1 s evaluations hold a restart in ten of them, 1/10 each (rate() extrapolates at the edges)
    (counted,) = query(run["prometheus"], f"sum_over_time({total}[1h])")
    assert float(counted["value"][1]) == pytest.approx(1.0, abs=0.3)
    storms = query(run["prometheus"], f'max_over_time(ALERTS{{alertname="{Alert.RESTART_STORM.value}"}}[1h])')
    assert storms == []


def test_a_finished_pods_last_settlement_reaches_prometheus(run):
    """A pod's end settles its last reorder window and saves; the demo stops each sidecar as a
    kubelet would (SIGTERM), and ``--final-scrape-timeout`` serves one more scrape. So Prometheus's
    last productive seconds of each pod that finished are its sidecar's final ones (the lost pod's
    unsettled seconds are not: its sidecar died with its node)."""
    assert run["returncode"] == 0, run["stderr"][-3000:]
    scraped = {p["metric"]["pod"]: float(p["value"][1]) for p in query(
        run["prometheus"], f'sum by (pod) (last_over_time({TIME.name}{{category="{Category.PRODUCTIVE.value}"}}[1h]))')}
    for pod in [f"pod-{i}" for i in range(run["pods"]) if i != 1] + ["pod-1-replacement"]:
        parts = state_store.load(run["run_dir"] / pod / "sidecar-state.json", run["run_dir"] / pod / "journal")
        assert parts is not None, pod
        snap = Engine.from_state(parts["engine"]).snapshot(time.monotonic(), time.time())
        assert snap.finished, pod
        final = sum(r.seconds[Category.PRODUCTIVE.value] for r in snap.ranks)
        assert final > 1.0 and scraped[pod] == pytest.approx(final, abs=1e-6), (pod, scraped[pod], final)


def _truth(run_dir: Path) -> tuple[float, float]:
    """The job's bad rank-seconds and its rank-seconds, from the raw journals: world × span, less
    the step work the job kept. A step's work is kept in its last execution (a step redone after
    a restore was lost the first time); the span runs from the job's first record to its last
    (one monotonic clock here)."""
    records = read_journal(*run_dir.glob("pod-*/journal"))
    kept: dict[tuple[int, int], float] = {}
    for r in records:
        if r["type"] == "step":
            kept[(r["rank"], r["step"])] = r["mono"] - r["start"] - r["data_s"]
    world = max(r["world_size"] for r in records if r["type"] == "process_start")
    total = world * (records[-1]["mono"] - records[0]["mono"])
    return total - sum(kept.values()), total


def _unseen_kept(run_dir: Path, seen_step: int) -> float:
    """The lost pod's step work that a save its sidecar had not read by its last scrape keeps: the
    steps after the newest save any scrape saw (``nvrx_checkpoint_last_step``), up to its newest
    durable save. Prometheus never saw that save, so the work counts at risk there; the job resumed
    from it and kept the work (the job report replays the journal)."""
    records = read_journal(run_dir / "pod-1" / "journal")
    late = max((r["step"] for r in records if r["type"] == "checkpoint_end" and r["ok"]), default=-1)
    return sum(r["mono"] - r["start"] - r["data_s"] for r in records
               if r["type"] == "step" and seen_step < r["step"] <= late)


def _unseen_lost(run: dict[str, Any], at: float) -> float:
    """The lost pod's rank-seconds no series holds: from the newest step any scrape read (its work at
    risk was exported up to about then; from its first record where no scrape read a step) to the
    first scrape that found its sidecar gone (Prometheus's own ``up``). Until that scrape the rules
    count its ranks as running, and nothing newer than its last scrape reaches them; the job report
    counts that time bad (steps no save kept, then absent). How long it is is the sidecar's poll and
    the scrapes' lag around the kill (a second or two on a quiet machine, more on a loaded one);
    the first scrape after the newest step read, as one may also fail while the sidecar starts."""
    records = read_journal(run["run_dir"] / "pod-1" / "journal")
    ranks = len({r["rank"] for r in records if r["type"] == "step"})
    seen = query(run["prometheus"], f'max_over_time({LAST_STEP_TIMESTAMP.name}{{pod="pod-1"}}[1h])', at)
    since = float(seen[0]["value"][1]) if seen else records[0]["wall"]
    return ranks * max(0.0, _found_gone(run, since, at) - since)


def _found_gone(run: dict[str, Any], since: float, at: float) -> float:
    """The wall time of the first scrape after ``since`` that found the lost pod's sidecar gone."""
    failed = f'timestamp(up{{instance="{run["targets"]["pod-1"]}"}} == 0) > {since}'
    (gone,) = query(run["prometheus"], f"min_over_time(({failed})[1h:1s])", at)
    return float(gone["value"][1])


def _last_save_seen(prometheus: str, at: float) -> int:
    """The step of the lost pod's newest durable save any scrape read; -1 where none did."""
    seen = query(prometheus, f'max_over_time({CKPT_LAST_STEP.name}{{pod="pod-1"}}[1h])', at)
    return int(float(seen[0]["value"][1])) if seen else -1


def _unread(run_dir: Path) -> float:
    """Each joining launcher's time from its start record to its next, pod 1's and its replacement's
    (its start record is written after its imports): the absent ranks the rules record may be early by
    as much (``test_prometheus_counts_the_lost_pods_rank_absent_as_the_job_report_does``)."""
    launchers = [sorted((r for r in read_journal(run_dir / pod / "journal") if r["rank"] is None),
                        key=lambda r: r["seq"]) for pod in ("pod-1", "pod-1-replacement")]
    return sum(records[1]["mono"] - records[0]["mono"] for records in launchers)


def _absent_rounding(run_dir: Path, instants: list[float], ago: float, step: float) -> float:
    """The rank-seconds the absent record's evaluations count beyond the journals' absent time: each
    evaluation counts the ranks no pod ran ``ago`` seconds before it (a pod runs one rank here, from
    its first record to its last) for a whole interval, so each end of an absent stretch is rounded
    to an evaluation."""
    spans = [(rs[0]["wall"], rs[-1]["wall"]) for rs in (read_journal(d) for d in run_dir.glob("pod-*/journal"))]
    start, end, world = min(s for s, _ in spans), max(e for _, e in spans), len(list(run_dir.glob("pod-*"))) - 1
    exact = world * (end - start) - sum(e - s for s, e in spans)
    at = [t - ago for t in instants if start <= t - ago < end]
    return sum(world - sum(s <= t < e for s, e in spans) for t in at) * step - exact


def test_the_job_error_ratio_prometheus_records_is_the_journals(run):
    """The bad rank-seconds the efficiency SLI recorded over the run (each evaluation's rate over
    the shortest window, 1 s apart) against the journals': the job's error ratio over its span
    within 1 pp by the time the job has ended — every sidecar gone, and the SLI's own resolution
    after (absent ranks are recorded as they stood a shortest window ago, 10 s here, and the SLI's
    rate is an average over a shortest window of them: what the job's last seconds held is in the
    record two windows later, ``SETTLED``, and nothing is added after; a run whose last pod finished
    a second after the others once had one absent rank-second arrive between one window and two).
    Each absent stretch's ends are rounded to the evaluations,
    as the rules sample them (up to an interval a rank each: 1 s here, 3% of a two-pod run). The
    finished pods' last settlement is in it: each sidecar, stopped, served it to two scrapes, so an
    evaluation saw it before its series went stale (one scrape left it to chance: a four-pod run
    once lost 17.5 rank-s of badput increments). The lost pod's work since its last save (its
    sidecar died with it) is in it; so is the work of a save its sidecar had not read by its last
    scrape, and its steps after its sidecar's last scrape are not (limits of any scraper). Its absent
    seconds may be early by the joining launchers' time to their next record, as the absent check allows."""
    assert run["returncode"] == 0, run["stderr"][-3000:]
    base = run["spec"].plan().base
    interval = run["spec"].evaluation_interval
    assert SETTLED == 2 * base + 2 * interval
    at = run["ended"] + SETTLED

    def settled(expr: str) -> list[dict[str, Any]]:
        return query(run["prometheus"], expr, at)

    (value,) = settled(f'sum_over_time({sli_bad_record(base)}{{slo="efficiency"}}[1h])')
    recorded = float(value["value"][1]) * interval
    (vanished,) = settled(f"sum_over_time({VANISHED_AT_RISK}[1h])")
    (absent,) = settled(f"{ABSENT_RANKS}[1h]")
    bad, total = _truth(run["run_dir"])
    bad += _absent_rounding(run["run_dir"], [float(t) for t, _ in absent["values"]], base, interval)
    unseen = _unseen_kept(run["run_dir"], _last_save_seen(run["prometheus"], at))
    unseen_lost = _unseen_lost(run, at)
    unread = _unread(run["run_dir"])
    # the increments add up to the pods' badput counters exactly, however bursty
    badput = "|".join(c.value for c in BADPUT_CATEGORIES)
    (counters,) = settled(f'sum(last_over_time({TIME.name}{{category=~"{badput}"}}[1h]))')
    (increments,) = settled(f"sum_over_time({BADPUT_INCREASE}[1h])")
    assert float(increments["value"][1]) == pytest.approx(float(counters["value"][1]), abs=0.01)
    print(f"\n{run['pods']} pods: recorded {recorded:.2f}, journals {bad:.2f} of {total:.2f} rank-s: "
          f"{100 * (recorded - bad) / total:+.2f} pp, {100 * unseen / total:.2f} + {100 * unread / total:.2f} pp "
          f"of it allowed (unseen save, launchers unread), "
          f"{100 * unseen_lost / total:.2f} pp below (unseen lost pod); "
          f"badput increments {float(increments['value'][1]):.2f} of counters {float(counters['value'][1]):.2f}")
    assert float(vanished["value"][1]) > 1.0  # the lost pod's: steps since its last save, and its tail
    assert (bad - unseen_lost) / total - 0.01 <= recorded / total <= (bad + unseen + unread) / total + 0.01, (
        recorded, bad, unseen, unseen_lost, unread, total)
    (later,) = query(run["prometheus"], f'sum_over_time({sli_bad_record(base)}{{slo="efficiency"}}[1h])')
    assert float(later["value"][1]) * interval == pytest.approx(recorded, abs=0.01 * total)  # and nothing after


# --- what badput cost (alerts/cost.py), and the fleet dashboard --------------------------------

def _report_costs(stdout: str) -> tuple[dict[tuple[str, str], float], float]:
    """The job report's cost table, (category label, cause) -> rank-seconds, and its price."""
    report = stdout.split("nvrx-slo SLO report — ")[1]
    section = report.split("What badput cost")[1].split("\n\n")[0]
    price = float(re.search(r"; ([\d.]+) USD per accelerator-hour", section).group(1))
    rows = {(m[1].strip(), m[2]): float(m[3]) for m in re.finditer(
        r"^  (.+?)\s{2}(\S+)\s+([\d.]+)\s+[\d.]+\s+\S+ USD$", section, re.M) if m[1].strip() != "total"}
    return rows, price


def test_prometheus_prices_badput_by_cause_as_the_job_report_does(run):
    """The cost of badput by cause, recorded at each evaluation (alerts/cost.py: each pod's fault
    seconds priced at its own price, the absent ranks and the lost pod's work at risk as pod_lost), and
    the job report's cost table (the engine's causes, the job's absent seconds): each cause's money
    within one evaluation interval of the job's work (2 ranks × 1 s, at the spec's default price: the
    demo's sidecars see no GPU), the absent and lost-pod seconds within what each already allows
    (the absent record's evaluations rounding each stretch's ends, the launchers' unread seconds; the
    lost pod's steps after its sidecar's last scrape, which Prometheus never saw at risk; the lost
    pod's save Prometheus never saw, whose work it counts at risk). The absent seconds' cause is
    pod_lost in both."""
    assert run["returncode"] == 0, run["stderr"][-3000:]
    at = run["ended"] + SETTLED
    rows, price = _report_costs(run["stdout"])
    assert price == run["spec"].price.default  # each rank one accelerator of no priced model
    report: dict[str, float] = {}
    for (category, cause), seconds in rows.items():
        if category.startswith(("lost", "restart", "absent")):
            report[cause] = report.get(cause, 0.0) + seconds
    assert {cause for (category, cause) in rows if category.startswith("absent")} == {"pod_lost"}
    costs = cost_increase(CostOf.CAUSE, True)
    recorded = {r["metric"]["cause"]: float(r["value"][1]) * 3600 / price
                for r in query(run["prometheus"], f"sum by (cause) (sum_over_time({costs}[1h]))", at)}
    sources = query(run["prometheus"], f"count by (price_source) (count_over_time({costs}[1h]))", at)
    assert {s["metric"]["price_source"] for s in sources} == {PriceSource.SPEC.value}
    base, interval = run["spec"].plan().base, run["spec"].evaluation_interval
    (absent,) = query(run["prometheus"], f"{ABSENT_RANKS}[1h]", at)
    rounding = _absent_rounding(run["run_dir"], [float(t) for t, _ in absent["values"]], base, interval)
    unseen = _unseen_kept(run["run_dir"], _last_save_seen(run["prometheus"], at))
    unseen_lost = _unseen_lost(run, at)
    unread = _unread(run["run_dir"])
    print(f"\n{run['pods']} pods: by cause, rank-s recorded {recorded}, in the report {report}")
    work = run["pods"] * interval  # one evaluation interval of the job's work
    assert set(recorded) == set(report), (recorded, report)
    for cause, seconds in report.items():
        if cause == FaultCause.POD_LOST.value:
            # the lost pod's save Prometheus never saw: its work counted at risk there, kept in the report
            low, high = rounding - interval - work - unseen_lost, rounding + unread + interval + 0.5 + work + unseen
            assert low <= recorded[cause] - seconds <= high, (cause, recorded[cause], seconds, rounding, unseen,
                                                              unseen_lost)
        else:
            assert recorded[cause] == pytest.approx(seconds, abs=work), (cause, recorded[cause], seconds)
    assert recorded[FaultCause.POD_LOST.value] >= 8.0  # the replacement came 8 s after the loss


_SPEC = spec.from_dict(_spec_data())
# the fleet dashboard as generated for the run's spec: its windows' records are the ones the rules make
FLEET = dashboard_queries({Dashboard.FLEET.value: json.loads(dashboard_files.to_json(
    fleet.dashboard(_SPEC, _SPEC.plan())))})


@pytest.mark.parametrize("panel", [pytest.param(x, id=f"{x.where}:{i}") for i, x in enumerate(FLEET)])
def test_every_fleet_dashboard_query_returns_data_for_the_node_loss(run, panel):
    """The fleet dashboard's queries as Grafana sends them (generated for the run's three-hour SLO
    period; its namespace variable at All: the demo's pods have no namespace), over the run: from the
    first scrape to the SLI's last evaluation."""
    assert run["returncode"] == 0, run["stderr"][-3000:]
    (first,) = query(run["prometheus"], f"min(min_over_time(timestamp({TIME.name})[1h:1s]))", run["ended"] + SETTLED)
    start, end = float(first["value"][1]), run["ended"] + SETTLED
    values = {"__rate_interval": "4s", "__interval": "1s", "__range": f"{int(end - start)}s",
              "namespace": NAMESPACE_ALL_VALUE}
    expr = panel.expr
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    if panel.where.startswith("variable "):
        url = f"{run['prometheus']}/api/v1/series?{urllib.parse.urlencode({'match[]': expr})}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert json.load(resp)["data"], expr
        return
    if panel.instant:
        rows = [[r["value"]] for r in query(run["prometheus"], expr, end)]
    else:
        params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 1})
        with urllib.request.urlopen(f"{run['prometheus']}/api/v1/query_range?{params}", timeout=10) as resp:
            answer = json.load(resp)
        assert answer["status"] == "success", answer
        rows = [r["values"] for r in answer["data"]["result"]]
    assert any(math.isfinite(float(v)) for values_ in rows for _, v in values_), f"no data for {expr}"
