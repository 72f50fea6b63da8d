"""One two-pod node-loss demo scraped by every backend the rule tests compare (``tests/conftest.py``
runs it once a session): Prometheus in one tier and in two, and VictoriaMetrics in one and in two.

The demo: ``nvrx-slo demo --pods 2 --node-loss 1`` (pod 1 and its sidecar SIGKILLed at step 15, a
replacement 8 s later), each sidecar a scrape target as it starts (file service discovery).

Prometheus (``tests/test_rules_sharded.py``), the rules for ``SPEC`` (1 s evaluations):

* *single* runs the one-Prometheus file and, as shard ``cluster="a"``, remote-writes the job-level
  records the global tier reads to *global*, which runs the global file over what it receives;
* *idle shard* runs the local file with nothing to scrape, ``cluster="b"``, remote-writing too.

VictoriaMetrics (``tests/test_rules_victoriametrics.py``), the rules for ``VM_SPEC`` (15 s
evaluations, see below), beside a Prometheus running the same rules (*reference*) over every sample
*single* scraped (remote-written: a stopped sidecar serves its final numbers to two scrapes, so two
scrapers, not three):

* *one*: vmagent scrapes the sidecars into a VictoriaMetrics; one vmalert runs the local file against
  it and writes what it records back through the vmagent, another runs the global file against the
  same storage (docs/scaling.md: on VictoriaMetrics the tiers run apart, even on one storage);
* *global*: the same vmagent relays the local tier's job-level records to a second VictoriaMetrics,
  with ``cluster="a"``, where a vmalert runs the global file;
* an *idle shard*: a vmalert running the local file against an empty VictoriaMetrics, writing to the
  global one with ``cluster="b"``.

Both global vmalerts and the one's send their alerts to a real Alertmanager (the generated config),
whose pager is a webhook here.

Why VictoriaMetrics runs at 15 s: vmalert writes what it records asynchronously (no read-after-write)
and VictoriaMetrics 1.79 answers a sample ~1 s after it is written, a new series' ~8-11 s after
(measured, docs/scaling.md). A rule reading what the previous evaluation recorded (each target's
badput sum) needs the interval above that; the deploy default is 1 m. vmalert evaluates the local
tier ``LOCAL_LOOKBACK`` in the past (a new pod's series are visible by then) and the global tier
``GLOBAL_LOOKBACK`` in the past (what the local tier recorded, relayed, is visible by then).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

import yaml

from backends import alertmanager, follow, prometheus, victoria_metrics, vmagent, vmalert
from nvrx_slo.alerts import files as alert_files
from nvrx_slo.alerts import spec
from nvrx_slo.generate import main as generate_main
from servers import HttpStub

SPEC = {"period": "3h", "min_window": "10s", "evaluation_interval": "1s"}
VM_SPEC = {"period": "12h", "min_window": "30s", "evaluation_interval": "15s"}
LOCAL_LOOKBACK, GLOBAL_LOOKBACK = 15, 30
STEPS = "200"  # a job of two minutes or so: eight evaluations at 15 s
VM_TOOLS = ("victoria-metrics", "vmagent", "vmalert")
# How a local tier picks the records the global tier reads (docs/scaling.md): job-level ones.
JOB_LEVEL = re.compile(r"(namespace_job_name|global):.+")
RAW = "(nvrx|DCGM)_.+|up"  # what a Prometheus scraped, none of what it recorded
_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


@dataclass
class Fleet:
    returncode: int
    stderr: str
    run_dir: Path
    ended: float  # Unix time: every pod and sidecar gone
    single: str  # Prometheus base URLs (SPEC)
    global_: str
    interface: set[str]  # the local tier's records the global tier reads
    spec: spec.Spec
    vm: dict[str, str] | None  # reference (Prometheus), one, global (VictoriaMetrics); None: not installed
    vm_spec: spec.Spec
    pages: list[dict[str, Any]]  # what Alertmanager's pager received


def groups(text: str) -> dict[str, list[dict[str, Any]]]:
    return {g["name"]: g["rules"] for g in yaml.safe_load(text)["groups"]}


def recorded(rule_groups: dict[str, list[dict[str, Any]]]) -> set[str]:
    return {r["record"] for rules in rule_groups.values() for r in rules if "record" in r}


def reads(rule: dict[str, Any]) -> set[str]:
    """The series names a rule's expression reads (PromQL words that are metric names; a range or
    subquery's brackets hold none: ``[1h:5m]``)."""
    words = _NAME.findall(re.sub(r"\[[^\]]*\]", "", rule["expr"]))
    return {w for w in words if ":" in w or w.startswith(("nvrx_", "DCGM_")) or w == "up"}


def _rules(tmp: Path, overrides: dict[str, Any], alertmanager: dict[str, str] | None = None) -> tuple[Path, spec.Spec]:
    data = yaml.safe_load(spec.DEFAULT_PATH.read_text()) | overrides
    if alertmanager:
        data["alertmanager"].update(alertmanager)
    tmp.mkdir()
    (tmp / "slo.yaml").write_text(yaml.safe_dump(data))
    assert generate_main(["alerts", "--spec", str(tmp / "slo.yaml"), "--root", str(tmp)]) == 0
    return tmp, spec.load(tmp / "slo.yaml")


def _names(names: set[str]) -> str:
    return "|".join(re.escape(n) for n in sorted(names))


def _remote_write(url: str, names: str) -> dict[str, Any]:
    """Every sample of the series whose name matches ``names``, as soon as possible (windows sum each one)."""
    return {"url": f"{url}/api/v1/write", "metadata_config": {"send": False},
            "queue_config": {"batch_send_deadline": "200ms", "min_backoff": "100ms"},
            "write_relabel_configs": [{"source_labels": ["__name__"], "action": "keep", "regex": names}]}


def _prometheus_tiers(stack: ExitStack, tmp: Path, scrape: list[dict[str, Any]],
                      reference: str | None) -> tuple[str, str, set[str]]:
    rules, _ = _rules(tmp / "prometheus", SPEC)
    local, global_ = (groups((rules / f).read_text()) for f in (alert_files.LOCAL_RULES, alert_files.GLOBAL_RULES))
    interface = recorded(local) & {n for rs in global_.values() for r in rs for n in reads(r)}
    every = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    ruler = prometheus(stack, tmp, "global", {"global": every, "rule_files": [str(rules / alert_files.GLOBAL_RULES)]},
                       "--web.enable-remote-write-receiver")
    prometheus(stack, tmp, "idle-shard", {"global": every | {"external_labels": {"cluster": "b"}},
                                          "rule_files": [str(rules / alert_files.LOCAL_RULES)],
                                          "remote_write": [_remote_write(ruler, _names(interface))]})
    single = prometheus(stack, tmp, "single", {"global": every | {"external_labels": {"cluster": "a"}},
                                               "rule_files": [str(rules / alert_files.RULES)], "scrape_configs": scrape,
                                               "remote_write": [_remote_write(ruler, _names(interface))] + (
                                                   [_remote_write(reference, RAW)] if reference else [])})
    return single, ruler, interface


def _pager(stack: ExitStack) -> tuple[str, list[dict[str, Any]]]:
    received: list[dict[str, Any]] = []

    def answer(method: str, path: str, headers: Message, body: bytes) -> tuple[int, str, bytes]:
        received.append(json.loads(body))
        return 200, "text/plain", b""

    hook = HttpStub(answer)
    stack.callback(hook.close)
    return hook.url, received


def _victoria_tiers(stack: ExitStack, tmp: Path, rules: Path, scrape: list[dict[str, Any]]) -> dict[str, str]:
    local, global_ = rules / alert_files.LOCAL_RULES, rules / alert_files.GLOBAL_RULES
    am = alertmanager(stack, tmp, rules / alert_files.ALERTMANAGER)
    one, ruler, idle = (victoria_metrics(stack, tmp, n) for n in ("vm-one", "vm-global", "vm-idle"))
    job_level = [{"source_labels": ["__name__"], "regex": JOB_LEVEL.pattern, "action": "keep"},
                 {"target_label": "cluster", "replacement": "a"}]
    # vmagent reads the file as often as -promscrape.fileSDCheckInterval says, and refuses refresh_interval
    files = [{**job, "file_sd_configs": [{"files": c["files"]} for c in job["file_sd_configs"]]} for job in scrape]
    agent = vmagent(stack, tmp, "vmagent", {"global": {"scrape_interval": "1s"}, "scrape_configs": files},
                    [(one, None), (ruler, job_level)])
    # an instant selector reads back a scrape interval, not 5 minutes: a pod gone is gone (no staleness)
    local_delay, global_delay = (["-datasource.queryStep=1s", f"-datasource.lookback={s}s"]
                                 for s in (LOCAL_LOOKBACK, GLOBAL_LOOKBACK))
    vmalert(stack, tmp, "vmalert-local", local, one, agent, am, flags=local_delay)
    vmalert(stack, tmp, "vmalert-one-global", global_, one, one, am, flags=global_delay)
    vmalert(stack, tmp, "vmalert-global", global_, ruler, ruler, am, flags=global_delay)
    vmalert(stack, tmp, "vmalert-idle", local, idle, ruler, am, labels={"cluster": "b"}, flags=local_delay)
    return {"one": one, "global": ruler}


def run(tmp: Path) -> Iterator[Fleet]:
    """Start every backend, run the demo, wait for every tier to hold the job's end, yield."""
    targets = tmp / "targets.json"
    targets.write_text("[]")
    scrape = [{"job_name": "nvrx-slo", "honor_labels": True, "scrape_interval": "1s",
               "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]}]
    with ExitStack() as stack:
        pager, pages = _pager(stack)
        vm: dict[str, str] | None = None
        vm_rules, vm_spec = _rules(tmp / "vm-rules", VM_SPEC, {
            "pager_url": f"{pager}/pager", "ticket_url": f"{pager}/ticket", "group_wait": "1s", "group_interval": "1s"})
        if all(shutil.which(t) for t in VM_TOOLS):
            # the same samples as single scraped (two scrapers of a stopped sidecar share its final scrapes)
            reference = prometheus(stack, tmp, "reference", {"rule_files": [str(vm_rules / alert_files.RULES)]},
                                   "--web.enable-remote-write-receiver")
            vm = {"reference": reference, **_victoria_tiers(stack, tmp, vm_rules, scrape)}
        single, ruler, interface = _prometheus_tiers(stack, tmp, scrape, vm and vm["reference"])
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        demo = subprocess.Popen(
            [sys.executable, "-m", "nvrx_slo", "demo", "--pods", "2", "--node-loss", "1", "--replace-after", "8",
             "--steps", STEPS, "--final-scrape-timeout", "10", "--run-dir", str(tmp / "run")],
            stdout=subprocess.PIPE, stderr=open(tmp / "demo.stderr", "wb"), text=True, env=env)
        stack.callback(lambda: demo.poll() is None and demo.kill())
        out: list[str] = []
        reader = threading.Thread(target=follow, args=(demo.stdout, targets, out), daemon=True)
        reader.start()
        demo.wait(timeout=600)
        ended = time.time()
        reader.join(timeout=10)
        # Prometheus: the last scrapes, the records a shortest window (10 s) late, a remote-write batch,
        # an evaluation. VictoriaMetrics: the local tier's lookback, its shortest window and two
        # evaluations, then the global tier's lookback.
        settle = 20 if vm is None else LOCAL_LOOKBACK + 30 + 2 * 15 + GLOBAL_LOOKBACK
        time.sleep(max(0.0, ended + settle - time.time()))
        yield Fleet(demo.returncode, (tmp / "demo.stderr").read_text(errors="replace"), tmp / "run", ended,
                    single, ruler, interface, spec.load(tmp / "prometheus" / "slo.yaml"), vm, vm_spec, pages)
