"""End to end on loopback: a real job breaches its SLO and a page reaches a webhook.

The chain, all real: the demo job (``nvrx_slo.trainer.reference.harness.run_demo``: the reference FSDP job on 2 CPU
ranks under ft_launcher and ``inprocess.Wrapper``, journaling through the trainer hooks) →
``nvrx-slo sidecar`` (/metrics) → Prometheus 2.42 (static scrape, 1 s scrape
and evaluation) with the rules ``nvrx-slo generate alerts`` writes for this test's spec →
Alertmanager 0.25 with the generated config → the webhook receiver below (pager and ticket paths).

The spec is the default with a 5-day period: every window scales by 1/6 (1h → 10 min, 5m →
50 s). A page needs 14.4% of ten minutes — 86 s per rank — of badput, so a breach pages within
two minutes, while a short healthy run cannot page however slow its start-up (tens of seconds of
``init`` per rank on a busy 2-core machine, all badput). The breach is synchronous checkpoints on
slow storage: the loop is blocked most of the time, burning the efficiency budget ~100× too fast.
Each test prints its timings (``-s``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any

import pytest
import yaml

from needs import tool
from nvrx_slo.alerts import duration, spec
from nvrx_slo.alerts import files as alert_files
from nvrx_slo.alerts.conventions import Alert
from nvrx_slo.generate import main as generate_main
from nvrx_slo.trainer.reference.harness import run_demo
from servers import HttpStub, free_port, stop, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.nvrx, pytest.mark.external]

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "nvrx-e2e"
PERIOD = "5d"
PAGE_TIMEOUT_S = 240.0  # the job's start-up alone can take a minute on a loaded machine


def _ready(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=1) as resp:
        return resp.status == 200


@dataclass
class Webhook:
    """Alertmanager's webhook receiver: records every notification by path (/pager, /ticket)."""

    port: int
    received: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def notifications(self, path: str, job_name: str) -> list[dict[str, Any]]:
        with self.lock:
            return [n for p, n in self.received if p == path and n["groupLabels"].get("job_name") == job_name]


def _serve_webhook() -> tuple[Webhook, HttpStub]:
    hook = Webhook(0)

    def answer(method: str, path: str, headers: Message, body: bytes) -> tuple[int, str, bytes]:
        with hook.lock:
            hook.received.append((path, json.loads(body)))
        return 200, "text/plain", b""

    server = HttpStub(answer)
    hook.port = server.port
    return hook, server


@dataclass
class Stack:
    tmp: Path
    prometheus: str  # base URLs
    alertmanager: str
    webhook: Webhook
    sidecar_ports: dict[str, int]
    spec: spec.Spec

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            answer = json.load(resp)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def tickets_held_back(self, job_name: str) -> bool:
        """Alertmanager has the job's warning alerts, and every one is inhibited by a page."""
        query = urllib.parse.urlencode({"filter": f'job_name="{job_name}"'})
        with urllib.request.urlopen(f"{self.alertmanager}/api/v2/alerts?{query}", timeout=10) as resp:
            warnings = [a for a in json.load(resp) if a["labels"].get("severity") == "warning"]
        return bool(warnings) and all(a["status"]["inhibitedBy"] for a in warnings)


def _e2e_spec(tmp: Path, hook: Webhook) -> Path:
    data = yaml.safe_load(spec.DEFAULT_PATH.read_text())
    data.update(period=PERIOD, min_window="4s", evaluation_interval="1s")
    data["alertmanager"].update(
        pager_url=f"http://127.0.0.1:{hook.port}/pager", ticket_url=f"http://127.0.0.1:{hook.port}/ticket",
        group_wait="1s", group_interval="1s",
    )
    path = tmp / "slo.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


JOBS = ("healthy", "breach")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("alerts-e2e")
    hook, server = _serve_webhook()
    spec_file = _e2e_spec(tmp, hook)
    assert generate_main(["alerts", "--spec", str(spec_file), "--root", str(tmp)]) == 0  # the real CLI entry point
    sidecar_ports = {job: free_port() for job in JOBS}
    am_port, prom_port = free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(subprocess.Popen(
            [tool("prometheus-alertmanager"), f"--config.file={tmp / alert_files.ALERTMANAGER}",
             f"--storage.path={tmp / 'am'}", f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=",
             "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "alertmanager.log", "wb")))
        config = tmp / "prometheus.yml"
        config.write_text(json.dumps({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp / alert_files.RULES)],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am_port}"]}]}]},
            "scrape_configs": [{"job_name": "nvrx-slo", "honor_labels": True, "static_configs": [
                {"targets": [f"127.0.0.1:{port}" for port in sidecar_ports.values()]}]}],
        }))
        procs.append(subprocess.Popen(
            [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "wb")))
        wait_for(lambda: _ready(f"http://127.0.0.1:{am_port}/-/ready"), "Alertmanager ready", 30)
        wait_for(lambda: _ready(f"http://127.0.0.1:{prom_port}/-/ready"), "Prometheus ready", 30)
        yield Stack(tmp, f"http://127.0.0.1:{prom_port}", f"http://127.0.0.1:{am_port}", hook, sidecar_ports,
                    spec.load(spec_file))
    finally:
        for proc in reversed(procs):
            stop(proc)
        server.close()


def _identity(job_name: str) -> dict[str, str]:
    """The pod identity the trainer and the sidecar read from the Downward API in a cluster."""
    return {"NVRX_SLO_JOB": job_name, "POD_NAMESPACE": NAMESPACE, "POD_NAME": f"{job_name}-0",
            "HOSTNAME": f"{job_name}-0", "PYTHONUNBUFFERED": "1"}


def _sidecar(stack: Stack, job_name: str) -> subprocess.Popen[bytes]:
    """The pod's sidecar, following the journal directory the demo is about to create."""
    env = {**os.environ, **_identity(job_name)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.Popen(
        [sys.executable, "-m", "nvrx_slo", "sidecar", "--journal-dir", str(stack.tmp / job_name / "journal"),
         "--host", "127.0.0.1", "--port", str(stack.sidecar_ports[job_name]), "--poll-interval", "0.25",
         "--state-file", str(stack.tmp / f"{job_name}-sidecar-state.json")],
        env=env, stdout=subprocess.DEVNULL, stderr=open(stack.tmp / f"{job_name}-sidecar.log", "wb"))


_LAUNCHER_FILE = re.compile(r"\.launcher\.(\d+)\.jsonl$")


def _launcher_pids(journal_dir: Path) -> list[int]:
    """The demo's launcher leads the run's process group and names its pid in its journal file."""
    return [int(m.group(1)) for p in journal_dir.glob("*.launcher.*.jsonl") if (m := _LAUNCHER_FILE.search(p.name))]


def _reap(journal_dir: Path) -> list[int]:
    """SIGKILL what is left of a run: every process whose environment names this run's journal.

    torchelastic starts each rank in a session of its own, and NVRx's workers are the ranks'
    children, so a run's processes are not all in the launcher's process group.
    """
    marker = f"NVRX_SLO_JOURNAL_DIR={journal_dir}\0".encode()
    killed = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if marker in (proc / "environ").read_bytes():
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
    return killed


def _end_run(journal_dir: Path, demo: threading.Thread) -> None:
    """Stop a demo run as a kubelet stops a pod: SIGTERM the launcher (it stops its workers), then reap."""
    for pid in _launcher_pids(journal_dir):
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    demo.join(timeout=30)
    _reap(journal_dir)
    demo.join()


def _max_burn(stack: Stack, job_name: str, window: str) -> float:
    """The highest 1h-equivalent burn rate Prometheus recorded for the job while it ran."""
    record = f"namespace_job_name:nvrx_slo_burn_rate:rate{window}"
    result = stack.query(f'max_over_time({record}{{slo="efficiency", job_name="{job_name}"}}[1h])')
    assert result, f"no {record} was ever recorded for {job_name}: the SLI was not measured"
    return float(result[0]["value"][1])


def _page_window(stack: Stack) -> str:
    """The page policy's 1h window, scaled to the period."""
    return duration.format(stack.spec.plan().burn_windows[0].long)


def test_a_healthy_run_pages_nothing(stack: Stack) -> None:
    run_dir = stack.tmp / "healthy"
    sidecar = _sidecar(stack, "healthy")
    try:
        started = time.monotonic()
        result = run_demo(run_dir, faults=(), steps=20, checkpoint_every=5,
                          extra_env=_identity("healthy"), timeout_s=PAGE_TIMEOUT_S)
        assert result.returncode == 0, result.log_path.read_text()[-3000:]
        ran = time.monotonic() - started
        time.sleep(8)  # the last scrapes, evaluations and any notification land
    finally:
        _reap(run_dir / "journal")
        stop(sidecar)
    burn = _max_burn(stack, "healthy", _page_window(stack))
    print(f"healthy run: {ran:.0f}s, highest {_page_window(stack)} burn rate {burn:.1f}")
    assert 0 < burn < stack.spec.plan().burn_windows[0].factor, f"a healthy run burnt at {burn:.1f}×"
    assert stack.webhook.notifications("/pager", "healthy") == []


def test_a_breach_pages_with_the_job_labels_and_a_runbook(stack: Stack) -> None:
    """The breach: every step is followed by a synchronous save on storage 8 s slow."""
    run_dir = stack.tmp / "breach"
    sidecar = _sidecar(stack, "breach")
    demo = threading.Thread(target=run_demo, args=(run_dir,), kwargs=dict(
        faults=(), steps=100_000, checkpoint_every=1, extra_args=("--checkpoint-mode", "sync", "--slow-storage", "8"),
        extra_env=_identity("breach"), timeout_s=PAGE_TIMEOUT_S))
    started = time.monotonic()
    demo.start()
    try:
        wait_for(lambda: stack.webhook.notifications("/pager", "breach"), "a page for the breach", PAGE_TIMEOUT_S)
        paged_after = time.monotonic() - started
        # the checkpoint SLOs burn too (warnings); while the page fires, their tickets are held back
        wait_for(lambda: stack.tickets_held_back("breach"), "the breach's tickets inhibited by its page", 15)
    finally:
        _end_run(run_dir / "journal", demo)
        stop(sidecar)
    notification = stack.webhook.notifications("/pager", "breach")[0]
    assert notification["status"] == "firing"
    assert notification["groupLabels"] == {"namespace": NAMESPACE, "job_name": "breach"}
    alert, = [a for a in notification["alerts"] if a["labels"]["alertname"] == Alert.EFFICIENCY_BURN.value]
    assert alert["labels"] == {"alertname": Alert.EFFICIENCY_BURN.value, "namespace": NAMESPACE, "job_name": "breach",
                               "severity": "critical", "slo": "efficiency"}
    runbook = alert["annotations"]["runbook_url"]
    assert runbook == stack.spec.runbook_url.replace("{alert}", Alert.EFFICIENCY_BURN.value)
    assert (ROOT / "docs" / "runbooks" / runbook.rsplit("/", 1)[1]).exists()
    assert f"{NAMESPACE}/breach spends its training efficiency error budget" in alert["annotations"]["description"]
    print(f"paged {paged_after:.0f}s after the breach job started")
