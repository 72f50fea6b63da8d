"""The rules for more than one Prometheus (docs/scaling.md): the two tiers the generator writes apart.

The fast tests check the split itself on the generated files: each group's rules in the one-Prometheus
file are its local rules and its global rules, in order; no local rule reads what a global rule
records (so the local file alone records what the one Prometheus records); the global rules read no
series of the pods, only job-level records of the local tier (the names a local Prometheus must
send on, matched by the one regex the plan gives).

The slow test runs the split for real: three Prometheus servers on loopback (Debian's 2.42 here,
2.53 on Debian 13).

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

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import yaml

from needs import tool
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
from nvrx_slo.generate import main as generate_main
from servers import free_port, stop, wait_for

# How a local Prometheus picks the records the global tier reads (docs/scaling.md): job-level ones.
JOB_LEVEL = re.compile(r"(namespace_job_name|global):.+")
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_SIDECAR = re.compile(r"^sidecar of (\S+): http://(127\.0\.0\.1:\d+)/ \(status page\)", re.M)
SPEC = {"period": "3h", "min_window": "10s", "evaluation_interval": "1s"}


def _groups(text: str) -> dict[str, list[dict[str, Any]]]:
    return {g["name"]: g["rules"] for g in yaml.safe_load(text)["groups"]}


def _recorded(groups: dict[str, list[dict[str, Any]]]) -> set[str]:
    return {r["record"] for rules in groups.values() for r in rules if "record" in r}


def _reads(rule: dict[str, Any]) -> set[str]:
    """The series names a rule's expression reads (PromQL words that are metric names; a range or
    subquery's brackets hold none: ``[1h:5m]``)."""
    words = _NAME.findall(re.sub(r"\[[^\]]*\]", "", rule["expr"]))
    return {w for w in words if ":" in w or w.startswith(("nvrx_", "DCGM_")) or w == "up"}


@pytest.fixture(scope="module")
def files() -> dict[str, dict[str, list[dict[str, Any]]]]:
    s = spec.load()
    rendered = alert_files.render(s, s.plan(), "test")
    return {"single": _groups(rendered[alert_files.RULES]), "local": _groups(rendered[alert_files.LOCAL_RULES]),
            "global": _groups(rendered[alert_files.GLOBAL_RULES])}


def test_each_group_is_its_local_rules_then_its_global_rules_in_order(files):
    assert set(files["local"]) | set(files["global"]) == set(files["single"])
    for name, rules in files["single"].items():
        local, global_ = files["local"].get(name, []), files["global"].get(name, [])
        assert [r for r in rules if r in local] == local and [r for r in rules if r in global_] == global_, name
        assert len(local) + len(global_) == len(rules), name


def test_the_local_tier_reads_nothing_the_global_tier_records(files):
    from_global = _recorded(files["global"])
    for name, rules in files["local"].items():
        for rule in rules:
            assert not _reads(rule) & from_global, (name, rule.get("record") or rule.get("alert"))


def test_the_global_tier_reads_only_job_level_records_of_the_local_tier(files):
    from_local = _recorded(files["local"])
    for name, rules in files["global"].items():
        before: set[str] = set()  # a global rule may read a global record its group recorded earlier
        for rule in rules:
            foreign = _reads(rule) - before - {n for n in from_local if JOB_LEVEL.fullmatch(n)}
            assert not foreign, (name, rule.get("record") or rule.get("alert"), foreign)
            before |= {rule["record"]} if "record" in rule else set()


def test_the_global_tier_tells_jobs_apart_by_all_their_labels(files):
    """A global ruler sees each shard's records with its external labels: a join on the job's labels
    alone would drop them from the SLIs and alerts, and fail on a job name two shards share."""
    for name, rules in files["global"].items():
        for rule in rules:
            assert not re.search(r"\bon \(", rule["expr"]), (name, rule.get("record") or rule.get("alert"))


# --- the split, run for real ------------------------------------------------------------------------


def _ready(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=1) as resp:
        return resp.status == 200


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=10) as r:
        answer = json.load(r)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def _prometheus(stack: ExitStack, tmp: Path, name: str, config: dict[str, Any], *flags: str) -> str:
    (tmp / f"{name}.yml").write_text(json.dumps(config))
    port = free_port()
    proc = subprocess.Popen(
        [tool("prometheus"), f"--config.file={tmp / f'{name}.yml'}", f"--storage.tsdb.path={tmp / name}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", *flags],
        stdout=subprocess.DEVNULL, stderr=open(tmp / f"{name}.log", "wb"))
    stack.callback(stop, proc)
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _ready(f"{url}/-/ready"), f"Prometheus {name} ready", 30)
    return url


def _remote_write(url: str, names: set[str]) -> dict[str, Any]:
    """Every sample of the named series, as soon as possible (windows sum each one)."""
    return {"url": f"{url}/api/v1/write", "metadata_config": {"send": False},
            "queue_config": {"batch_send_deadline": "200ms", "min_backoff": "100ms"},
            "write_relabel_configs": [{"source_labels": ["__name__"], "action": "keep",
                                       "regex": "|".join(re.escape(n) for n in sorted(names))}]}


def _follow(stdout: Any, targets: Path, out: list[str]) -> None:
    """Each sidecar becomes a scrape target as the demo starts it (file service discovery)."""
    for line in stdout:
        out.append(line)
        if match := _SIDECAR.match(line):
            seen = json.loads(targets.read_text()) + [{"targets": [match.group(2)]}]
            (targets.with_suffix(".tmp")).write_text(json.dumps(seen))
            targets.with_suffix(".tmp").replace(targets)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sharded")
    data = yaml.safe_load(spec.DEFAULT_PATH.read_text()) | SPEC
    (tmp / "slo.yaml").write_text(yaml.safe_dump(data))
    assert generate_main(["alerts", "--spec", str(tmp / "slo.yaml"), "--root", str(tmp)]) == 0
    local, global_ = (_groups((tmp / f).read_text()) for f in (alert_files.LOCAL_RULES, alert_files.GLOBAL_RULES))
    interface = _recorded(local) & {n for rules in global_.values() for r in rules for n in _reads(r)}
    every = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    targets = tmp / "targets.json"
    targets.write_text("[]")
    with ExitStack() as stack:
        ruler = _prometheus(stack, tmp, "global",
                            {"global": every, "rule_files": [str(tmp / alert_files.GLOBAL_RULES)]},
                            "--web.enable-remote-write-receiver")
        _prometheus(stack, tmp, "idle-shard", {
            "global": every | {"external_labels": {"cluster": "b"}}, "rule_files": [str(tmp / alert_files.LOCAL_RULES)],
            "remote_write": [_remote_write(ruler, interface)]})
        single = _prometheus(stack, tmp, "single", {
            "global": every | {"external_labels": {"cluster": "a"}}, "rule_files": [str(tmp / alert_files.RULES)],
            "scrape_configs": [{"job_name": "nvrx-slo", "honor_labels": True,
                                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]}],
            "remote_write": [_remote_write(ruler, interface)]})
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        demo = subprocess.Popen(
            [sys.executable, "-m", "nvrx_slo", "demo", "--pods", "2", "--node-loss", "1", "--replace-after", "8",
             "--final-scrape-timeout", "10", "--run-dir", str(tmp / "run")],
            stdout=subprocess.PIPE, stderr=open(tmp / "demo.stderr", "wb"), text=True, env=env)
        stack.callback(lambda: demo.poll() is None and demo.kill())
        out: list[str] = []
        reader = threading.Thread(target=_follow, args=(demo.stdout, targets, out), daemon=True)
        reader.start()
        demo.wait(timeout=600)
        reader.join(timeout=10)
        # the last scrapes, the records a shortest window (10 s) late, a remote-write batch, an evaluation
        time.sleep(20)
        yield {"single": single, "global": ruler, "returncode": demo.returncode, "interface": interface,
               "stderr": (tmp / "demo.stderr").read_text(errors="replace"), "spec": spec.load(tmp / "slo.yaml")}


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
    single, ruler = (_query(fleet[p], expr) for p in ("single", "global"))
    # the shard's label survives to the job's SLIs
    assert {r["metric"].get("cluster") for r in ruler} == {"a"}, [r["metric"] for r in ruler]
    # both shards' evaluation counters reached the ruler: its windows divide by the most either counted
    counters = _query(fleet["global"], f'count by (cluster) ({{__name__="{EVALUATIONS}", slo="efficiency"}})')
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
    assert _query(fleet["single"], page), "the single Prometheus did not page: nothing to compare"
    assert _query(fleet["global"], page)
