"""``nvrx-slo demo --pods 2``: a job of two pods (real ft_launcher agents meeting in a c10d
rendezvous, one gloo rank each), a real sidecar per pod, and the job-level SLO report.

Checked against what is outside the code under test: the raw journal records of both pods (the
fault's instant, each rank's first step after it, on the machine's one monotonic clock) and an
offline replay of each pod's journal against what its live sidecar saved.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.exporter import state_store
from nvrx_slo.exporter.engine import Engine
from nvrx_slo.exporter.snapshot import Snapshot
from nvrx_slo.exporter.tail import JournalTail
from nvrx_slo.trainer.demo import read_journal, summarize

PODS = ("pod-0", "pod-1")


@dataclass(frozen=True)
class Run:
    run_dir: Path
    stdout: str
    stderr: str
    returncode: int


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run_dir = tmp_path_factory.mktemp("pods") / "run"
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    proc = subprocess.run([sys.executable, "-m", "nvrx_slo", "demo", "--pods", "2", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=600, env=env)
    return Run(run_dir, proc.stdout, proc.stderr, proc.returncode)


def _sidecar(run: Run, pod: str) -> Snapshot:
    journal = run.run_dir / pod / "journal"
    parts = state_store.load(run.run_dir / pod / "sidecar-state.json", journal)
    assert parts is not None
    return Engine.from_state(parts["engine"]).snapshot(time.monotonic(), time.time())


def _replay(run: Run, pod: str) -> Snapshot:
    engine, seen = Engine(), []

    def ingest(events: list) -> None:
        for event in events:
            engine.ingest(event)
            seen.append((event.mono, event.wall))

    tail = JournalTail(run.run_dir / pod / "journal")
    tail.poll(ingest)
    tail.close()
    return engine.snapshot(*max(seen))


def test_every_pod_finishes_and_the_job_report_adds_up_what_each_sidecar_accounted(run):
    assert run.returncode == 0, run.stderr[-3000:]
    header = run.stdout.split("nvrx-slo SLO report — ")[1].splitlines()[0]
    assert header == "job demo, 2 pods (pod-0, pod-1), 2 rank(s), finished"
    live = [_sidecar(run, pod) for pod in PODS]
    assert all(snap.finished for snap in live)
    assert [[r.rank for r in snap.ranks] for snap in live] == [[0], [1]]
    # each live sidecar accounted what an offline replay of its pod's journal does
    for snap, pod in zip(live, PODS, strict=True):
        offline = _replay(run, pod)
        assert snap.wall_s == pytest.approx(offline.wall_s, abs=1e-6)
        for category, seconds in offline.seconds.items():
            assert snap.seconds[category] == pytest.approx(seconds, abs=1e-6), (pod, category)
    wall = float(re.search(r"Where the time went \(([\d.]+) rank-seconds of wall\)", run.stdout).group(1))
    assert wall == pytest.approx(sum(snap.wall_s for snap in live), abs=0.05)
    productive = float(re.search(r"^  productive\s+([\d.]+) s", run.stdout, re.M).group(1))
    assert productive == pytest.approx(sum(snap.seconds[Category.PRODUCTIVE] for snap in live), abs=0.01)


def test_each_fault_is_one_restart_of_the_job_with_the_latency_the_raw_records_give(run):
    assert run.returncode == 0, run.stderr[-3000:]
    records = read_journal(*(run.run_dir / pod / "journal" for pod in PODS))
    truth = {r["kind"]: r for r in summarize(records)["restarts"]}
    assert (truth["crash"]["level"], truth["exception"]["level"]) == ("in-job", "in-process")
    report = run.stdout.split("nvrx-slo SLO report — ")[1]
    counts = dict(re.findall(r"^  (inprocess|injob|pod)\s+(none|\d+)", report, re.M))
    assert counts == {"inprocess": "1", "injob": "1", "pod": "none"}  # each pod saw both faults
    recent = report.split("most recent:")[1].split("MTBF")[0]
    latency = {level: float(s) for level, s in re.findall(r"^\s+(inprocess|injob)\s+([\d.]+) s", recent, re.M)}
    assert latency["injob"] == pytest.approx(truth["crash"]["latency"], abs=0.1)
    assert latency["inprocess"] == pytest.approx(truth["exception"]["latency"], abs=0.1)
    # each pod's own sidecar counted its share: the survivor's relaunch is in-job, never a pod restart
    for pod in PODS:
        levels = {lv.value: n for lv, n in _sidecar(run, pod).restarts.counts.items()}
        assert levels["pod"] == 0 and levels["injob"] == 1, (pod, levels)


def test_a_wrong_pod_count_is_refused_naming_the_flag():
    proc = subprocess.run([sys.executable, "-m", "nvrx_slo", "demo", "--pods", "0"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--pods" in proc.stderr and "at least 1" in proc.stderr
