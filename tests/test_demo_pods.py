"""``nvrx-slo demo --pods N``: a job of two (and four) pods (real ft_launcher agents meeting in a
c10d rendezvous, one gloo rank each), a real sidecar per pod, and the job-level SLO report.

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

from journal_truth import read_journal, summarize
from nvrx_slo.contracts.catalogue import Category, RestartLevel
from nvrx_slo.exporter import state_store
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.engine.snapshot import Snapshot
from nvrx_slo.exporter.ingest.tail import JournalTail

PODS = ("pod-0", "pod-1")


@dataclass(frozen=True)
class Run:
    run_dir: Path
    stdout: str
    stderr: str
    returncode: int


def _demo(run_dir: Path, *args: str) -> Run:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    proc = subprocess.run([sys.executable, "-m", "nvrx_slo", "demo", *args, "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=600, env=env)
    return Run(run_dir, proc.stdout, proc.stderr, proc.returncode)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _demo(tmp_path_factory.mktemp("pods") / "run", "--pods", "2")


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


def _adds_up(run: Run, pods: list[str]) -> None:
    """Every pod finished, each live sidecar accounted what an offline replay of its pod's journal
    does, and the job report is their sum: wall = world size × the job's span."""
    assert run.returncode == 0, run.stderr[-3000:]
    header = run.stdout.split("nvrx-slo SLO report — ")[1].splitlines()[0]
    assert header == f"job demo, {len(pods)} pods ({', '.join(pods)}), {len(pods)} rank(s), finished"
    live = [_sidecar(run, pod) for pod in pods]
    assert all(snap.finished for snap in live)
    assert [[r.rank for r in snap.ranks] for snap in live] == [[i] for i in range(len(pods))]
    for snap, pod in zip(live, pods, strict=True):
        offline = _replay(run, pod)
        assert snap.wall_s == pytest.approx(offline.wall_s, abs=1e-6)
        for category, seconds in offline.seconds.items():
            assert snap.seconds[category] == pytest.approx(seconds, abs=1e-6), (pod, category)
    # the job's wall is its world size × its span: the pods' walls and the rank-seconds no pod ran
    # (the others start once pod-0 hosts the rendezvous; the first to finish waits for the last)
    # (printed to 0.1 s, the absent seconds to 0.01 s)
    wall = float(re.search(r"Where the time went \(([\d.]+) rank-seconds of wall\)", run.stdout).group(1))
    absent = re.search(r"^  absent \(no pod ran the rank\)\s+([\d.]+) s", run.stdout, re.M)
    assert wall == pytest.approx(sum(snap.wall_s for snap in live) + float(absent.group(1) if absent else 0), abs=0.056)
    starts = [snap.job_start_wall for snap in live]
    ends = [snap.job_start_wall + snap.ranks[0].wall_s for snap in live]
    assert wall == pytest.approx(len(pods) * (max(ends) - min(starts)), abs=0.051)
    productive = float(re.search(r"^  productive\s+([\d.]+) s", run.stdout, re.M).group(1))
    assert productive == pytest.approx(sum(snap.seconds[Category.PRODUCTIVE] for snap in live), abs=0.01)
    # each fault (the crash, the exception) is one restart of the job, seen by every pod
    report = run.stdout.split("nvrx-slo SLO report — ")[1]
    counts = dict(re.findall(r"^  (inprocess|injob|pod)\s+(none|\d+)", report, re.M))
    assert counts == {"inprocess": "1", "injob": "1", "pod": "none"}


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.nvrx
def test_every_pod_finishes_and_the_job_report_adds_up_what_each_sidecar_accounted(run):
    _adds_up(run, list(PODS))


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.nvrx
def test_four_pods_add_up_to_one_job_with_one_restart_per_fault(tmp_path):
    _adds_up(_demo(tmp_path / "run", "--pods", "4"), [f"pod-{i}" for i in range(4)])


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.nvrx
def test_each_fault_is_one_restart_of_the_job_with_the_latency_the_raw_records_give(run):
    assert run.returncode == 0, run.stderr[-3000:]
    records = read_journal(*(run.run_dir / pod / "journal" for pod in PODS))
    truth = {r["kind"]: r for r in summarize(records)["restarts"]}
    assert (truth["crash"]["level"], truth["exception"]["level"]) == ("in-job", "in-process")
    report = run.stdout.split("nvrx-slo SLO report — ")[1]
    recent = report.split("most recent:")[1].split("MTBF")[0]
    latency = {level: float(s) for level, s in re.findall(r"^\s+(inprocess|injob)\s+([\d.]+) s", recent, re.M)}
    # 0.1 s in 4 of 5 runs here; once the report read 0.19 s longer than the raw records (7.54 vs
    # 7.35 s: which step ends the job's in-job restart in a race is not settled yet; issue 12's note)
    assert latency["injob"] == pytest.approx(truth["crash"]["latency"], abs=0.25)
    assert latency["inprocess"] == pytest.approx(truth["exception"]["latency"], abs=0.1)
    # each pod's own sidecar counted its share: the survivor's relaunch is in-job, never a pod restart
    for pod in PODS:
        levels = {lv.value: n for lv, n in _sidecar(run, pod).restarts.counts.items()}
        assert levels["pod"] == 0 and levels["injob"] == 1, (pod, levels)


@pytest.mark.parametrize(("args", "flag", "why"), [
    (["--pods", "0"], "--pods", "at least 1"),
    (["--pods", "2", "--node-loss", "0"], "--node-loss", "pod 0 hosts the rendezvous"),
    (["--pods", "2", "--node-loss", "2"], "--node-loss", "from 1 to --pods - 1"),
    (["--pods", "2", "--node-loss", "1", "--replace-after", "-1"], "--replace-after", "not be negative"),
    # one pod: refused before the demo asks torch how many GPUs it may use
    (["--final-scrape-timeout", "-1"], "--final-scrape-timeout", "from 0 to 60"),
    (["--reorder-window", "61"], "--reorder-window", "from 0 to 60"),
])
def test_a_wrong_flag_is_refused_naming_the_flag(args, flag, why):
    proc = subprocess.run([sys.executable, "-m", "nvrx_slo", "demo", *args], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and flag in proc.stderr and why in proc.stderr, proc.stderr


@pytest.fixture(scope="module")
def node_loss(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _demo(tmp_path_factory.mktemp("node-loss") / "run",
                 "--pods", "2", "--node-loss", "1", "--replace-after", "8")


def _span(records: list[dict]) -> tuple[float, float]:
    return records[0]["mono"], records[-1]["mono"]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.nvrx
def test_a_lost_pods_rank_is_absent_until_its_replacement_runs_it(node_loss):
    """pod-1's processes and sidecar are SIGKILLed at step 15; pod-1-replacement starts 8 s later
    and takes rank 1. Ground truth from the raw journals (one monotonic clock on this machine):
    rank 1 ran in no pod from pod-1's last record to the replacement launcher's start, and each
    rank ran in no pod before its pod's first record and after its last."""
    run = node_loss
    assert run.returncode == 0, run.stderr[-3000:]
    report = run.stdout.split("nvrx-slo SLO report — ")[1]
    assert report.splitlines()[0] == "job demo, 3 pods (pod-0, pod-1, pod-1-replacement), 2 rank(s), finished"
    assert "pod-1: 1 rank(s), efficiency" in run.stdout and "lost with its node" in run.stdout
    pods = {pod: read_journal(run.run_dir / pod / "journal") for pod in ("pod-0", "pod-1", "pod-1-replacement")}
    spans = {pod: _span(records) for pod, records in pods.items()}
    start, end = min(s for s, _ in spans.values()), max(e for _, e in spans.values())
    truth = 2 * (end - start) - sum(e - s for s, e in spans.values())
    absent = float(re.search(r"^  absent \(no pod ran the rank\)\s+([\d.]+) s", report, re.M).group(1))
    # pod-1's accounting runs to the kill (its sidecar stopped then), at most a poll (0.2 s) and a
    # step after its last record
    assert truth - 1.0 <= absent <= truth + 0.01, (absent, truth)
    assert absent >= spans["pod-1-replacement"][0] - spans["pod-1"][1] >= 8.0
    wall = float(re.search(r"Where the time went \(([\d.]+) rank-seconds of wall\)", report).group(1))
    assert wall == pytest.approx(2 * (end - start), abs=0.1)  # the world size × the job's span
    # the step work the job kept, each step's in its last execution (one redone after the restore
    # was lost the first time): the lost pod's work since its last save is lost, nothing undecided
    kept = {(r["rank"], r["step"]): r["mono"] - r["start"] - r["data_s"]
            for r in read_journal(*(run.run_dir / pod / "journal" for pod in pods)) if r["type"] == "step"}
    productive = float(re.search(r"^  productive\s+([\d.]+) s", report, re.M).group(1))
    unprotected = float(re.search(r"^  unprotected \(not yet checkpointed\)\s+([\d.]+) s", report, re.M).group(1))
    assert (productive, unprotected) == pytest.approx((sum(kept.values()), 0.0), abs=0.02)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.nvrx
def test_the_survivor_restarts_in_job_and_the_job_counts_one_restart_until_both_ranks_train(node_loss):
    run = node_loss
    assert run.returncode == 0, run.stderr[-3000:]
    report = run.stdout.split("nvrx-slo SLO report — ")[1]
    counts = dict(re.findall(r"^  (inprocess|injob|pod)\s+(none|\d+)", report, re.M))
    assert counts == {"inprocess": "none", "injob": "1", "pod": "none"}
    survivor = read_journal(run.run_dir / "pod-0" / "journal")
    replacement = read_journal(run.run_dir / "pod-1-replacement" / "journal")
    lost_end = read_journal(run.run_dir / "pod-1" / "journal")[-1]["mono"]
    # The fault as the survivor's journal dates it: its step's collective losing the peer
    # (step_failed); else, when the loss found it outside a step (e.g. finishing a save), the instant
    # its launcher saw the worker exit (launcher_worker_exit, from the kernel), as the engine dates it
    running = [r for r in survivor if r["mono"] <= lost_end and r["rank"] is not None][-1]["pid"]
    failed = [r["mono"] for r in survivor if r["type"] == "step_failed" and r["pid"] == running]
    exited = [r["mono"] for r in survivor if r["type"] == "launcher_worker_exit" and r.get("worker_pid") == running]
    fault = (failed or exited)[0]
    back = max(next(r["start"] for r in records if r["type"] == "step" and r["mono"] > fault)
               for records in (survivor, replacement))
    recent = report.split("most recent:")[1].split("MTBF")[0]
    (latency,) = [float(s) for s in re.findall(r"^\s+injob\s+([\d.]+) s", recent, re.M)]
    # within 0.1 s mostly; the job's end read 0.09 s early once (the survivor's first step, not the
    # replacement's a little later: see the healthy run's latency check above)
    assert latency == pytest.approx(back - fault, abs=0.25)
    assert latency > 8.0  # the replacement came 8 s after the loss
    assert _sidecar(run, "pod-0").restarts.counts[RestartLevel.INJOB] == 1
    assert sum(_sidecar(run, "pod-1-replacement").restarts.counts.values()) == 0  # its first process


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.nvrx
def test_the_job_report_replays_every_pods_journal_and_finds_the_lost_pod_itself(node_loss):
    """The HTML report the demo writes (``nvrx-slo report DIR...`` over the three journal
    directories) is not told which pod was lost: it reads that from the journals. Its accounting
    agrees with the sidecars' printed job report (the lost pod's sidecar died with it, so it may
    have missed the records of its last poll), and its timeline has a lane per rank and pod."""
    run = node_loss
    assert run.returncode == 0, run.stderr[-3000:]
    document = (run.run_dir / "report.html").read_text()
    assert f"HTML report of the job, every pod's lanes: {run.run_dir / 'report.html'}" in run.stdout
    lanes = re.findall(r'<g class="tl-lane" data-rank="(\d+)" data-pod="([^"]*)"', document)
    assert lanes == [("0", "pod-0"), ("1", "pod-1"), ("1", "pod-1-replacement")]
    assert document.count('data-kind="restart"') == 1
    printed = run.stdout.split("nvrx-slo SLO report — ")[1]

    def seconds(cat: Category) -> float:
        return float(re.search(rf'id="seconds-{cat.value}" class="[^"]*" data-value="([^"]*)"', document).group(1))

    absent = float(re.search(r"^  absent \(no pod ran the rank\)\s+([\d.]+) s", printed, re.M).group(1))
    assert seconds(Category.ABSENT) == pytest.approx(absent, abs=1.0)
    unprotected = float(re.search(r"^  unprotected \(not yet checkpointed\)\s+([\d.]+) s", printed, re.M).group(1))
    # the lost pod's unsettled time settled as its going decided it, as the demo did
    assert seconds(Category.UNPROTECTED) == pytest.approx(unprotected, abs=0.01)


def _save_attempts(pods: dict[str, list[dict]], lost: str) -> list[tuple[str, str]]:
    """Each save of the job, oldest first, with what the journals say became of it. The world is
    two ranks, one process each at a time: the processes that started before the lost pod's last
    record are the job's first incarnation, the rest its second, and each incarnation saves an id
    once. A save failed if a rank journaled a failed end, is durable once both ranks journaled an
    ok one, and never finished otherwise (the lost pod's share of a save in flight)."""
    lost_end = pods[lost][-1]["mono"]
    first = {}  # pid -> its first record's mono
    attempts: dict[tuple[str, int], dict] = {}
    for records in pods.values():
        for r in records:
            first.setdefault(r["pid"], r["mono"])
            if r["type"] not in ("checkpoint_start", "checkpoint_end"):
                continue
            key = (r["ckpt"], int(first[r["pid"]] > lost_end))
            a = attempts.setdefault(key, {"began": float("inf"), "ends": []})
            if r["type"] == "checkpoint_start":
                a["began"] = min(a["began"], r["mono"])
            else:
                a["ends"].append(r["ok"])
    status = {(ckpt, gen): "FAILED" if False in a["ends"] else "durable" if a["ends"].count(True) == 2
              else "unfinished" for (ckpt, gen), a in attempts.items()}
    return [(ckpt, status[(ckpt, gen)]) for (ckpt, gen) in sorted(attempts, key=lambda k: attempts[k]["began"])]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.nvrx
def test_the_node_loss_reports_list_the_saves_ranks_and_pods_the_journals_show(node_loss):
    """What the demo prints and its HTML report say of the saves (a save in flight when the node
    went failed, and its retry after the restart is durable), the lost pod's rank (lost, its
    checkpoint worker with it) and its replacement's, each under its own pod, against the journals."""
    run = node_loss
    assert run.returncode == 0, run.stderr[-3000:]
    names = ("pod-0", "pod-1", "pod-1-replacement")
    pods = {pod: read_journal(run.run_dir / pod / "journal") for pod in names}
    truth = _save_attempts(pods, "pod-1")
    assert len(truth) <= 10 and truth[-1][1] == "durable"  # every save listed; the last one kept the job
    printed = run.stdout.split("nvrx-slo SLO report — ")[1].split("latest saves")[1].split("Restart latency")[0]
    listed = re.findall(r"^    (step-\d+)\s+step \d+\s.*\s(durable|FAILED|in flight or unfinished)$", printed, re.M)
    assert [(c, s.replace("in flight or unfinished", "unfinished")) for c, s in listed] == truth
    document = (run.run_dir / "report.html").read_text()
    table = re.findall(r'<tr data-ckpt="([^"]+)">.*?<td class="(?:pass|fail|na)">(\w+)</td>', document)
    assert table[::-1] == truth and "No checkpoint yet." not in document
    assert re.search(r"node <b>[, ]*</b>", document) is None  # the demo's pods name no node
    ended = {pod for pod, records in pods.items() if any(r["type"] == "process_end" for r in records)}
    assert ended == {"pod-0", "pod-1-replacement"}
    ranks = re.findall(r'<tr data-rank="(\d)" data-pod="([^"]*)"><td>\d</td><td>[^<]*</td><td>(\w+)</td>'
                       r'(?:<td[^>]*>[^<]*</td>){4}<td>(\w+)</td>', document)
    truth_ranks = sorted((str(next(r["rank"] for r in records if r["rank"] is not None)), pod) for pod, records in
                         pods.items())
    assert [(rank, pod) for rank, pod, _, _ in ranks] == truth_ranks
    assert {pod: (state, worker) for _, pod, state, worker in ranks} == {
        "pod-0": ("ended", "stopped"), "pod-1": ("lost", "lost"), "pod-1-replacement": ("ended", "stopped")}
    assert ">rank 1 · pod-1 (lost)<" in document and ">rank 1 · pod-1-replacement<" in document


_REFUSE_TORCH = """import sys

class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ModuleNotFoundError(f"No module named {name!r} (refused by the test)", name=name)

sys.meta_path.insert(0, _Refuse())
"""


def test_a_job_that_fails_before_its_first_record_stops_every_sidecar_and_says_so(tmp_path):
    """Every launcher fails at once (torch refused in every process the demo starts): no journal is
    ever written, so each sidecar is still unready (its /metrics answers 503) when the demo stops
    them. Each is stopped all the same (one that answered 503 once left every sidecar running), and
    the demo exits non-zero naming the failure and where to look."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_REFUSE_TORCH)
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    env["PYTHONPATH"] = str(tmp_path / "site")
    proc = subprocess.run([sys.executable, "-m", "nvrx_slo", "demo", "--pods", "2", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode != 0 and "the job failed" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert f"see {run_dir / 'demo.log'}" in proc.stderr
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if str(run_dir).encode() in cmdline.read_bytes():
                left.append(cmdline.parent.name)
        except OSError:  # gone meanwhile
            pass
    assert not left, f"processes of the run still running: {left}"
