"""``nvrx-slo demo``: the reference job with the real sidecar beside it, ending in the SLO report.

With ``--pods N`` the job runs as N pods, each a launcher with its own journal and sidecar, and
the report is the job's: every pod's sidecar accounting, added up by ``exporter/offline/rollup.py``.

It spans the rooms, so it lives here rather than in ``trainer/`` (which may not import the
exporter) or ``exporter/`` (which may not import torch): the job is
``nvrx_slo.trainer.reference.harness.run_demo``, the sidecar is the ``nvrx-slo sidecar`` process a pod
would run, and what is printed at the end is the sidecar's own SLO report (written on SIGTERM, as in
a pod) plus an HTML report with a timeline.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from nvrx_slo.contracts import pod_env
from nvrx_slo.contracts.targets import Targets
from nvrx_slo.exporter import state_store
from nvrx_slo.exporter.engine.engine import REORDER_WINDOW_S, Engine
from nvrx_slo.exporter.engine.snapshot import Snapshot
from nvrx_slo.exporter.offline import progress, report, rollup
from nvrx_slo.exporter.offline.replay import Replay
from nvrx_slo.exporter.views import slo_report
from nvrx_slo.trainer.reference import harness

_SERVING = re.compile(r"serving (http://127\.0\.0\.1:\d+)/metrics")
LOSS_STEP = 15  # --node-loss: the step the lost pod's rank reaches before its node goes


class _Sidecar:
    """``nvrx-slo sidecar`` on a free loopback port, following a journal directory."""

    def __init__(self, run_dir: Path, journal_dir: Path, pod: str | None, final_scrape_s: float,
                 reorder_window_s: float) -> None:
        """``pod``: the pod's name, as its processes journal it (None: the host's, as theirs)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        self.journal_dir = journal_dir
        self.report_file = run_dir / "slo-report.txt"
        self.state_file = run_dir / "sidecar-state.json"
        self.log_path = run_dir / "sidecar.log"
        self.final_scrape_s = final_scrape_s
        env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
        env.update({pod_env.JOB: harness.JOB_NAME, **({pod_env.POD: pod} if pod else {})})  # the Downward API's
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nvrx_slo", "sidecar", "--journal-dir", str(journal_dir), "--host", "127.0.0.1",
             "--port", "0", "--state-file", str(self.state_file), "--report-file", str(self.report_file),
             "--final-scrape-timeout", str(final_scrape_s), "--reorder-window", str(reorder_window_s)],
            stdout=subprocess.DEVNULL, stderr=self._log, env=env)
        self.url = self._wait_for_url()

    def _wait_for_url(self, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if match := _SERVING.search(self.log_path.read_text(errors="replace")):
                return match.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"the sidecar did not start; see {self.log_path}")

    def events_read(self) -> float:
        """Journal records it has read so far: 0 while it cannot say (not ready: a 503; or gone)."""
        try:
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:  # URLError, HTTPError, a timeout
            return 0.0
        match = re.search(r"^nvrx_exporter_events_total(?:\{[^}]*\})? (\S+)$", text, re.M)
        return float(match.group(1)) if match else 0.0

    def stop(self, journal_records: int, timeout_s: float = 15.0) -> str:
        """Stop it, return its report. With a final scrape, SIGTERM at once, as a kubelet does when
        the main container exits (the sidecar reads the journal's end on its way out); without,
        first let it read the whole journal."""
        deadline = time.monotonic() + timeout_s
        while (not self.final_scrape_s and time.monotonic() < deadline and self.proc.poll() is None
               and self.events_read() < journal_records):
            time.sleep(0.2)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s + self.final_scrape_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        if not self.report_file.exists():
            raise RuntimeError(f"the sidecar wrote no SLO report; see {self.log_path}")
        return self.report_file.read_text()

    def kill(self) -> None:
        """Its node is gone: SIGKILL, as a node loss ends a pod (Prometheus sees it vanish now)."""
        self.proc.kill()
        self.proc.wait()
        self._log.close()

    def snapshot(self) -> Snapshot:
        """What the stopped sidecar had accounted, from the state it saved on its way out."""
        parts = state_store.load(self.state_file, self.journal_dir)
        if parts is None:
            raise RuntimeError(f"the sidecar saved no state; see {self.log_path}")
        return Engine.from_state(parts["engine"]).snapshot(time.monotonic(), time.time())


def _replayed(journal_dir: Path, at: tuple[float, float], reorder_window_s: float) -> Snapshot:
    """A lost pod as its sidecar would have accounted it had it read every record before its node
    went (it was killed with the node): its journal, which outlives it here, replayed as of ``at``."""
    with Replay(journal_dir, reorder_window_s=reorder_window_s) as replay:
        replay.poll()
    return replay.view(at).snapshot


def _accepted(journal_dir: Path) -> int:
    """The journal records a sidecar accepts from ``journal_dir``: it has read them all once it says so."""
    with Replay(journal_dir) as replay:
        replay.poll()
    return 0 if replay.newest is None else replay.view().snapshot.events_accepted


def _stop_all(sidecars: dict[Path, _Sidecar]) -> dict[Path, str | None]:
    """Stop every sidecar, whatever the job did; each one's report, or None where it wrote none
    (said on stderr): one that cannot report never leaves the next one running."""
    reports: dict[Path, str | None] = {}
    for journal_dir, sidecar in sidecars.items():
        try:
            reports[journal_dir] = sidecar.stop(_accepted(journal_dir))
        except RuntimeError as exc:
            print(f"nvrx-slo demo: {exc}", file=sys.stderr)
            reports[journal_dir] = None
    return reports


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nvrx-slo demo", description=__doc__.splitlines()[0])
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / f"demo-{stamp}",
                        help="a fresh directory for the journal, checkpoints, logs and reports "
                             "(default: runs/demo-<time>)")
    parser.add_argument("--steps", type=_positive, help="training steps (default: 50 on CPU, 1500 on GPUs)")
    parser.add_argument("--size", choices=tuple(harness.SIZES),
                        help="the model: tiny (the CPU default), small, large (118 M parameters: the GPU default)")
    parser.add_argument("--save-every", type=_positive, metavar="N",
                        help="a checkpoint every N steps (default: 10 on CPU, 500 on GPUs)")
    parser.add_argument("--faults", metavar="KIND@STEP,...",
                        help="the faults to inject on the last rank, e.g. crash@24,exception@45, or none "
                             "(default: crash@24,exception@45 on CPU, crash@600,exception@1100 on GPUs)")
    parser.add_argument("--pods", type=_positive, default=1,
                        help="pods of the job, each one launcher with its own journal and sidecar: 1 runs "
                             "2 ranks in one pod, N > 1 one rank in each of N pods (default: 1)")
    parser.add_argument("--node-loss", type=int, metavar="K",
                        help=f"kill every process of pod K (and its sidecar) at step {LOSS_STEP}, as when its "
                             "node is lost, instead of the crash and the exception; needs --pods 2 or more, "
                             "and K from 1 (pod 0 hosts the rendezvous)")
    parser.add_argument("--replace-after", type=float, default=10.0, metavar="S",
                        help="with --node-loss: start a replacement pod (a new journal and sidecar) S seconds "
                             "after the loss, as Kubernetes reschedules it (default: 10)")
    parser.add_argument("--final-scrape-timeout", type=float, default=0.0, metavar="S",
                        help="once stopped, each sidecar waits up to S seconds for one more scrape, as in a pod: "
                             "set it when a Prometheus scrapes the sidecars (default: 0, none)")
    parser.add_argument("--reorder-window", type=float, default=REORDER_WINDOW_S, metavar="S",
                        help="each sidecar's reorder window: how long records wait to be accounted, so how "
                             "late settled numbers reach Prometheus (default: %(default)s)")
    return parser


def _device(parser: argparse.ArgumentParser, args: argparse.Namespace) -> harness.DemoDevice:
    """The run the arguments ask for, its faults those it injects (none on a node loss); exits (via
    ``parser.error``) on arguments that do not make one."""
    if args.node_loss is not None and not 0 < args.node_loss < args.pods:
        parser.error(f"--node-loss must name a pod from 1 to --pods - 1 (pod 0 hosts the rendezvous), "
                     f"not {args.node_loss}")
    if args.replace_after < 0:
        parser.error(f"--replace-after must not be negative, not {args.replace_after:g}")
    if not 0 <= args.final_scrape_timeout <= 60:
        parser.error(f"--final-scrape-timeout must be from 0 to 60 seconds, not {args.final_scrape_timeout:g}")
    if not 0 <= args.reorder_window <= 60:
        parser.error(f"--reorder-window must be from 0 to 60 seconds, not {args.reorder_window:g}")
    try:
        chosen = None if args.faults is None else harness.parse_faults(args.faults)
    except ValueError as exc:
        parser.error(f"--faults: {exc}")
    device = harness.demo_device(harness.visible_gpus() if args.pods == 1 else 0,  # one GPU per rank; pods: CPU
                                 size=args.size, steps=args.steps, checkpoint_every=args.save_every, faults=chosen)
    device = dataclasses.replace(device, faults=device.faults if args.node_loss is None else ())
    last = max(f.step for f in device.faults) if device.faults else LOSS_STEP
    if device.steps <= last:
        parser.error(f"--steps must be above {last}, the step of the last injected fault")
    return device


def _job_report(sidecars: dict[Path, _Sidecar], lost_at: dict[Path, tuple[float, float]], run_dir: Path,
                reorder_window_s: float, targets: Targets) -> None:
    """Each pod's line, then the job's SLO report (its pods rolled up) and its HTML report."""
    snapshots = [_replayed(d, lost_at[d], reorder_window_s) if d in lost_at else sidecar.snapshot()
                 for d, sidecar in sidecars.items()]
    for snap, (d, sidecar) in zip(snapshots, sidecars.items(), strict=True):
        eff = "—" if snap.efficiency is None else f"{100 * snap.efficiency:.2f}%"
        if d in lost_at:
            state = "lost with its node (its sidecar too; accounted from its journal)"
        else:
            state = f"{'finished' if snap.finished else 'running'}; its sidecar's report: {sidecar.report_file}"
        print(f"{snap.pod}: {len(snap.ranks)} rank(s), efficiency {eff}, {state}")
    print()
    gone = {snap.pod for snap, d in zip(snapshots, sidecars, strict=True) if d in lost_at}
    print(slo_report.render(rollup.job_snapshot(snapshots, lost=gone), targets), end="")
    html_report = report.write(list(sidecars), run_dir / "report.html", targets)
    print(f"\nHTML report of the job, every pod's lanes: {html_report}")


def main(argv: list[str], targets: Targets) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    device = _device(parser, args)
    faults, pods = device.faults, args.pods
    run_dir: Path = args.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    what = (", ".join(f"{f.kind} at step {f.step}" for f in faults) if faults else
            f"pod {args.node_loss} lost at step {LOSS_STEP}, replaced {args.replace_after:g} s later")
    shape = (f"{device.ranks} {device.kind.upper()} rank(s) under ft_launcher" if pods == 1
             else f"{pods} pods of 1 CPU rank, each under ft_launcher")
    print(f"nvrx-slo demo: {shape}, {what}; run directory {run_dir}", flush=True)
    sidecars: dict[Path, _Sidecar] = {}
    lost_at: dict[Path, tuple[float, float]] = {}  # a lost pod's journal -> when its sidecar died with it

    def start_sidecar(journal_dir: Path) -> None:
        timing = (args.final_scrape_timeout, args.reorder_window)
        sidecars[journal_dir] = (_Sidecar(run_dir, journal_dir, None, *timing) if pods == 1 else
                                 _Sidecar(journal_dir.parent, journal_dir, journal_dir.parent.name, *timing))
        print(f"sidecar of {journal_dir}: {sidecars[journal_dir].url}/ (status page), "
              f"{sidecars[journal_dir].url}/metrics", flush=True)

    def on_pod(event: str, journal_dir: Path) -> None:
        if event == "lost":
            lost_at[journal_dir] = (time.monotonic(), time.time())
            sidecars[journal_dir].kill()
        else:
            start_sidecar(journal_dir)

    for journal_dir in harness.journal_dirs(run_dir, pods):
        start_sidecar(journal_dir)
    loss = None if args.node_loss is None else harness.NodeLoss(args.node_loss, LOSS_STEP, args.replace_after)
    try:
        with progress.Progress(harness.journal_dirs(run_dir, pods)[0]):
            # on a node loss the survivors must fail and restart through ft_launcher to let the
            # replacement in: no in-process restart (it would go on without the lost rank)
            result = harness.run_demo(run_dir, steps=device.steps, pods=pods, faults=faults, node_loss=loss,
                                      on_pod=on_pod, inprocess=loss is None, device=device,
                                      checkpoint_every=device.checkpoint_every, timeout_s=device.timeout_s,
                                      extra_args=() if loss is None else ("--collective-timeout", "5"))
    finally:
        slo_reports = _stop_all({d: sidecar for d, sidecar in sidecars.items() if d not in lost_at})
    print()
    if None in slo_reports.values():  # a job that failed before its sidecars could account it
        print(f"the job failed (exit code {result.returncode}); see {result.log_path}", file=sys.stderr)
        return result.returncode or 1
    if pods == 1:
        (journal_dir,) = sidecars
        print(slo_reports[journal_dir], end="")
        print(f"\nHTML report with a timeline: {report.write([journal_dir], run_dir / 'report.html', targets)}")
    else:
        _job_report(sidecars, lost_at, run_dir, args.reorder_window, targets)
    if result.returncode != 0:
        print(f"the job failed (exit code {result.returncode}); see {result.log_path}", file=sys.stderr)
    return result.returncode
