"""Every dashboard query, run against a real Prometheus that scraped a real demo run.

No Grafana server installs here, so nothing renders the panels; instead each PromQL expression
(panel targets, annotations, the template variables' selectors) is sent to Debian's Prometheus
2.42 the way Grafana would send it, and must be accepted and return data.

The run: the real demo (``trainer.demo.run_demo``: the reference job on 2 CPU ranks under
ft_launcher, a crash, an in-process restart and several checkpoints) with the real sidecar
(``nvrx-slo sidecar``) beside it, scraped every second by Prometheus on 127.0.0.1 while the job
runs (rates need two samples).
A rule file of this test's own makes one alert fire on the run's restarts, so the "Firing
alerts" panel has an ALERTS series to select; the generated alert rules are loaded too, so the
dashboard's burn rates can be compared with the recording rules the alerts fire on.

How Grafana's variables are replaced: the template variables are resolved as Grafana does,
chained (namespace, then job within it, then pod within both), from the label values their own
selectors return; the pod variable takes its "All" value. Range queries cover the scraped span
with a 1 s step: ``$__interval`` = 1s, ``$__rate_interval`` = max(interval + scrape interval,
4 × scrape interval) = 4s (Grafana's formula), ``$__range`` = the span. Instant queries (stat and
table panels) are evaluated at the end of the span.

"Returns data" means at least one finite value, and every ``{{label}}`` a legend names is a label
of every returned series.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from alerts import conventions
from alerts import duration as alerts_duration
from alerts import generate as alerts_generate
from alerts.spec import Slo
from dashboard_model import ROOT, Query, legend_labels, load_all, queries
from dashboards import queries as q
from exporter import catalogue as cat
from trainer.demo import run_demo

pytestmark = pytest.mark.slow

SCRAPE_S = 1
STEP_S = 1
RATE_INTERVAL_S = max(STEP_S + SCRAPE_S, 4 * SCRAPE_S)
NAMESPACE, JOB, POD = "nvrx-dash-test", "dash-demo", "dash-demo-0"
TEST_ALERT = "NvrxDashboardTestRestarted"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.load(resp)


def _wait_for(check, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"gave up waiting for {what} after {timeout:.0f}s")


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen

    def api(self, path: str, **params: str) -> dict:
        """GET /api/v1/<path>; returns the whole answer, errors included (HTTP 400/422 carry JSON too)."""
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            return _get(url)
        except urllib.error.HTTPError as err:
            return json.load(err)


def _start_prometheus(tmp: Path, target: str) -> Prometheus:
    rules = tmp / "test-rules.yaml"
    rules.write_text(json.dumps({"groups": [{"name": "dashboards-test", "interval": f"{SCRAPE_S}s", "rules": [{
        "alert": TEST_ALERT,
        "expr": f"sum by ({q.NAMESPACE_LABEL}, {q.JOB_LABEL}) ({cat.RESTARTS.name}) > 0",
        "labels": {"severity": "info"},
    }]}]}))
    config = tmp / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
        "rule_files": [str(rules), str(ROOT / alerts_generate.RULES)],
        "scrape_configs": [{"job_name": "nvrx-slo", "honor_labels": True, "static_configs": [{"targets": [target]}]}],
    }))
    port = _free_port()
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "wb"))
    prom = Prometheus(f"http://127.0.0.1:{port}", proc)
    _wait_for(lambda: urllib.request.urlopen(f"{prom.url}/-/ready", timeout=1).status == 200, "Prometheus ready", 30)
    return prom


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass(frozen=True)
class Scraped:
    prom: Prometheus
    start: float  # first scrape that saw the job
    end: float  # last scrape before the sidecar stopped


def _substitute(expr: str, variables: dict[str, str], span_s: int) -> str:
    """Grafana's interpolation: built-in intervals and the template variables' current values."""
    values = {"__rate_interval": f"{RATE_INTERVAL_S}s", "__interval": f"{STEP_S}s", "__range": f"{span_s}s",
              **variables}
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


IDENTITY = {"NVRX_SLO_JOB": JOB, "POD_NAMESPACE": NAMESPACE, "POD_NAME": POD, "HOSTNAME": POD}  # the Downward API's


def _first_sample(prom: Prometheus, since: float, until: float) -> float:
    answer = prom.api("query_range", query=f'{cat.WALL.name}{{{q.JOB_LABEL}="{JOB}"}}',
                      start=f"{since:.3f}", end=f"{until:.3f}", step="1")
    assert answer["status"] == "success", answer
    stamps = [float(t) for r in answer["data"]["result"] for t, _ in r["values"]]
    assert stamps, "Prometheus never scraped the job's wall time"
    return min(stamps)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """Prometheus, after it scraped the sidecar all through a real run; stopped after the module."""
    assert shutil.which("prometheus"), "Debian's prometheus is needed (bash scripts/test.sh installs it)"
    tmp = tmp_path_factory.mktemp("dashboards-prometheus")
    run_dir = tmp / "demo"
    journal = run_dir / "journal"  # run_demo creates it; the sidecar waits for it
    sidecar_port = _free_port()
    prom = _start_prometheus(tmp, f"127.0.0.1:{sidecar_port}")
    try:
        sidecar = subprocess.Popen(
            [sys.executable, "-m", "nvrx_slo", "sidecar", "--journal-dir", str(journal), "--host", "127.0.0.1",
             "--port", str(sidecar_port), "--poll-interval", "0.25", "--state-file", str(tmp / "state.json")],
            env={**os.environ, **IDENTITY}, stdout=subprocess.DEVNULL, stderr=open(tmp / "sidecar.log", "wb"))
        try:
            began = time.time()
            result = run_demo(run_dir, extra_env=IDENTITY, timeout_s=240)
            assert result.returncode == 0, result.log_path.read_text(errors="replace")[-3000:]
            time.sleep(4 * SCRAPE_S)  # the final state scraped a few times, the test alert evaluated
            end = time.time()
        finally:
            _stop(sidecar)
        yield Scraped(prom, _first_sample(prom, began, end), end)
    finally:
        _stop(prom.proc)


MODELS = load_all()
QUERIES = queries(MODELS)
VARIABLES = [x for x in QUERIES if x.where.startswith("variable ")]
EXPECTED = {q.VAR_NAMESPACE: NAMESPACE, q.VAR_JOB: JOB, q.VAR_POD: POD}


def _label_values(s: Scraped, selector: str, label: str) -> list[str]:
    """What Grafana's ``label_values(selector, label)`` lists, via the series API."""
    answer = s.prom.api("series", **{"match[]": selector, "start": f"{s.start:.3f}", "end": f"{s.end:.3f}"})
    assert answer["status"] == "success", answer
    return sorted({series[label] for series in answer["data"] if label in series})


@pytest.fixture(scope="module")
def variables(scraped) -> dict[str, str]:
    """The template variables resolved in order, each from its own query with the earlier ones substituted."""
    resolved: dict[str, str] = {}
    span = int(scraped.end - scraped.start)
    for x in VARIABLES:
        name = x.where.removeprefix("variable ")
        label, = legend_labels(x.legend)
        if name in resolved:
            continue
        values = _label_values(scraped, _substitute(x.expr, resolved, span), label)
        assert values == [EXPECTED[name]], f"variable {name}: {values}"
        resolved[name] = values[0] if name != q.VAR_POD else q.POD_ALL_VALUE  # the pod variable defaults to All
    return resolved


def _finite(values: list) -> list[float]:
    return [float(v) for _, v in values if math.isfinite(float(v))]


@pytest.mark.parametrize("query", [pytest.param(x, id=f"{x.dashboard}:{x.where}:{i}") for i, x in enumerate(QUERIES)])
def test_every_query_is_accepted_and_returns_data(scraped, variables, query: Query):
    span = int(scraped.end - scraped.start)
    expr = _substitute(query.expr, variables, span)
    if query.where.startswith("variable "):
        label, = legend_labels(query.legend)
        assert _label_values(scraped, expr, label), f"{expr} lists no {label}"
        return
    if query.instant:
        answer = scraped.prom.api("query", query=expr, time=f"{scraped.end:.3f}")
    else:
        answer = scraped.prom.api("query_range", query=expr, start=f"{scraped.start:.3f}",
                                  end=f"{scraped.end:.3f}", step=str(STEP_S))
    assert answer["status"] == "success", f"Prometheus refused {expr}: {answer.get('error')}"
    result = answer["data"]["result"]
    rows = [r.get("values") or [r["value"]] for r in result]
    assert any(_finite(values) for values in rows), f"no data for {expr}"
    for r in result:
        missing = legend_labels(query.legend) - set(r["metric"])
        assert not missing, f"legend {query.legend!r} names {sorted(missing)}, not on {r['metric']}"


def _panel_queries(uid: str, title: str) -> list[Query]:
    found = [x for x in QUERIES if x.dashboard == uid and x.where == title]
    assert found, f"{uid} has no panel {title!r}"
    return found


def _instant(s: Scraped, variables: dict[str, str], expr: str) -> list[dict]:
    answer = s.prom.api("query", query=_substitute(expr, variables, int(s.end - s.start)), time=f"{s.end:.3f}")
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_the_time_accounting_stack_sums_to_wall_time(scraped, variables):
    """Settled categories plus the unprotected slice are all of wall time (the catalogue's invariant)."""
    shares = [float(r["value"][1]) for x in _panel_queries("nvrx-slo-overview", "Where the time went (since job start)")
              for r in _instant(scraped, variables, x.expr)]
    assert len(shares) == len(cat.SETTLED_CATEGORIES) + 1
    assert sum(shares) == pytest.approx(1.0, abs=1e-6)


def test_restarts_per_interval_count_each_restart_once(scraped, variables):
    """``x - x offset $__interval`` at step ``$__interval`` tiles time: the bars add up to the counter's rise."""
    bars, = _panel_queries("nvrx-slo-recovery", "Restarts over time")
    span = int(scraped.end - scraped.start)
    answer = scraped.prom.api("query_range", query=_substitute(bars.expr, variables, span),
                              start=f"{scraped.start:.3f}", end=f"{scraped.end:.3f}", step=str(STEP_S))
    counted = {r["metric"][q.LEVEL_LABEL]: sum(float(v) for _, v in r["values"]) for r in answer["data"]["result"]}
    total = q.by(q.LEVEL_LABEL, q.series(cat.RESTARTS))
    rise = {r["metric"][q.LEVEL_LABEL]: float(r["value"][1]) for r in _instant(scraped, variables, total)}
    at_start = scraped.prom.api("query", query=_substitute(total, variables, span), time=f"{scraped.start:.3f}")
    for r in at_start["data"]["result"]:
        rise[r["metric"][q.LEVEL_LABEL]] -= float(r["value"][1])
    assert sum(rise.values()) >= 2, f"the run should restart in-process and in-job: {rise}"
    assert counted == rise


def test_burn_rates_equal_the_recording_rules_the_alerts_fire_on(scraped, variables):
    """At each instant the generated rules recorded a burn rate, the dashboard's query gives the same number."""
    panel = {x.legend: x for x in _panel_queries("nvrx-slo-overview", "Burn rates")}
    compared = 0
    for legend, x in panel.items():
        record = conventions.burn_rate_record(alerts_duration.parse(legend))
        selector = f'{record}{{{conventions.SLO_LABEL}="{Slo.EFFICIENCY.value}", {q.JOB_LABEL}="{JOB}"}}'
        answer = scraped.prom.api("query", query=f"{selector}[10m]", time=f"{scraped.end:.3f}")
        assert answer["status"] == "success", answer
        for series in answer["data"]["result"]:
            for t, recorded in series["values"]:
                ours = scraped.prom.api("query", query=_substitute(x.expr, variables, 0), time=str(t))
                value, = [float(r["value"][1]) for r in ours["data"]["result"]]
                assert value == pytest.approx(float(recorded), rel=1e-9, abs=1e-12), (legend, t)
                compared += 1
    assert compared, "the alert rules recorded no burn rate during the run"
