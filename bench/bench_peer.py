"""Replay speed side by side with Google's ml-goodput-measurement 0.2.3 (the peer), on the same journal.

The journal is ``bench/synthetic_journal.py``'s, sized as ``bench/bench_ingest.py`` sizes it (by
default one rank asked for 1,000,000 events: 943,396 steps, a save every 50, one in-job restart).
The peer reads its log entries from a logger object (``GoodputCalculator(cloud_logger=...)``, as
its own tests do), so the same journal is converted once into its entries and handed to it through
an in-memory logger, no Google Cloud: per step its number and start time (``step_start_time``);
per process start a job start; per restore a training preparation (start, end); the launcher's
exit as the job's end. No save: the peer reads what saves cost from Orbax's checkpoint logger, a
tool of its own (``CheckpointBadputCalculator``), not from these entries (fed as custom badput
events instead, each step is checked against every one of them: 0.2.3 took 12 s for 100,000
events so). Three commands, each in a child process of its own, in alternating order,
``--repeat`` times:

  peer     load its entries (JSON lines) into the logger and ``get_job_goodput(include_badput_breakdown=True)``
  sidecar  the sidecar's path: ``JournalTail`` + ``Engine`` + a snapshot (``Live.poll``, ``Live.view``)
  report   ``nvrx-slo report JOURNAL -o report.html``

Each run's wall time (the child's whole life, interpreter start and imports included: what a user
waits for) and peak RSS (the kernel's, ``wait4``) are printed, then the medians, events/s and the
ratios to the peer's median; the load average is printed at the start and the end. The machine is
shared: the ratios, taken side by side, are the figures that travel.

The peer is never a dependency of this project: install it into a folder of its own, kept out of
git (``.bench/``), and name it with ``--peer``:

    .venv/bin/pip install --target .bench/peer ml-goodput-measurement==0.2.3

Usage: .venv/bin/python bench/bench_peer.py [--peer .bench/peer] [--events 1000000] [--ranks 1] [--repeat 8] [--dir DIR]
Targets (issue 33): the sidecar's path >= 10x the peer and >= 480k events/s in <= 40 MB; the report >= 5x the peer
in <= 120 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"sidecar": (10.0, 40.0), "report": (5.0, 120.0)}  # x the peer, MB
MIN_RATE = 480_000  # events/s, the sidecar's path


def peer_entries(journal: Path) -> Iterator[dict[str, object]]:
    """The peer's log entries for the journal's records, in the journal's order per file."""
    for path in sorted(journal.glob("*.jsonl")):
        with open(path, "rb") as f:
            for line in f:
                r = json.loads(line)
                kind, wall = r["type"], r["wall"]
                base = {"job_name": r["job"]}
                if kind == "step":
                    yield {**base, "step_count": r["step"], "step_start_time": wall - (r["mono"] - r["start"])}
                elif kind == "process_start":
                    yield {**base, "job_start_time": wall}
                elif kind == "restore":
                    yield {**base, "training_prep_start_time": wall - (r["mono"] - r["start"])}
                    yield {**base, "training_prep_end_time": wall}
                elif kind == "launcher_exit":
                    yield {**base, "job_end_time": wall}


def child_peer(entries: Path, cache: Path) -> None:
    """The peer: its entries loaded, then its goodput and badput computed (run with its site on the path)."""
    from ml_goodput_measurement.src import goodput, goodput_utils

    class Logger:  # the interface GoodputCalculator reads entries through (its tests' mock has the same)
        def __init__(self, path: Path) -> None:
            with open(path) as f:
                self.entries = [json.loads(line) for line in f]
            last = goodput_utils.get_timestamp_from_log_entry(self.entries[-1])
            self.last_entry_info = (last, "")

        def read_cloud_logging_entries(self, start_time: object = None, end_time: object = None,
                                       last_entry_info: object = None) -> tuple[list[dict[str, object]], object]:
            return self.entries, self.last_entry_info

    calculator = goodput.GoodputCalculator(job_name="bench", logger_name="bench", cloud_logger=Logger(entries),
                                           cache_dir=str(cache))
    ratio, badput, step = calculator.get_job_goodput(include_badput_breakdown=True)
    print(json.dumps({"goodput_pct": ratio, "last_step": step}))


def child_sidecar(journal: Path) -> None:
    """The sidecar's path over the journal: the reader into the engine, then a snapshot."""
    from nvrx_slo.exporter.engine.engine import Engine
    from nvrx_slo.exporter.ingest.tail import JournalTail
    from nvrx_slo.exporter.live import Live

    live = Live(Engine(), JournalTail(journal))
    handed = live.poll()
    snap = live.view().snapshot
    print(json.dumps({"events": handed, "accepted": snap.events_accepted, "efficiency": snap.efficiency}))


def run(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """One child: its wall time (s), peak RSS (MB, the kernel's) and what it printed."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{err.read()[-3000:]}")
        return elapsed, usage.ru_maxrss / 1024, out.read()


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer", type=Path, default=ROOT / ".bench" / "peer", help="where the peer is installed")
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--repeat", type=int, default=8, help="runs of each command, in alternating order")
    p.add_argument("--dir", type=Path, default=None, help="where to write the journal (default: a temp dir)")
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)  # (peer|sidecar, its input)
    args = p.parse_args()
    if args.child:
        kind, path = args.child
        child_sidecar(Path(path)) if kind == "sidecar" else child_peer(Path(path), Path(tempfile.mkdtemp()))
        return
    if not (args.peer / "ml_goodput_measurement").is_dir():
        raise SystemExit(f"no peer at {args.peer}: .venv/bin/pip install --target {args.peer} "
                         "ml-goodput-measurement==0.2.3")
    with tempfile.TemporaryDirectory() as tmp:
        compare(args, Path(tmp))


def compare(args: argparse.Namespace, tmp: Path) -> None:
    journal = args.dir or tmp / "journal"
    steps = int(args.events / args.ranks / (1 + 3 / 50))  # as bench_ingest: a step, and a save every 50 steps
    made = subprocess.run([sys.executable, str(ROOT / "bench" / "synthetic_journal.py"), str(journal), "--ranks",
                           str(args.ranks), "--steps", str(steps), "--restart-at", str(steps // 2)],
                          capture_output=True, text=True, check=True)
    events = int(made.stdout.split()[0])
    entries = tmp / "peer-entries.jsonl"
    with open(entries, "w") as f:
        n_entries = sum(f.write(json.dumps(e) + "\n") > 0 for e in peer_entries(journal))
    print(f"journal: {events:,} events, {args.ranks} rank(s), "
          f"{sum(x.stat().st_size for x in journal.glob('*.jsonl')) / 1e6:.0f} MB; the peer's entries: {n_entries:,}")
    print(f"start: {load()}")
    ours = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    commands = {
        # -S: none of this project's environment (its torch would be imported by the peer's tensorboardX)
        "peer": ([sys.executable, "-S", __file__, "--child", "peer", str(entries)],
                 {**ours, "PYTHONPATH": str(args.peer)}),
        "sidecar": ([sys.executable, __file__, "--child", "sidecar", str(journal)], ours),
        "report": ([sys.executable, "-m", "nvrx_slo", "report", str(journal), "-o", str(tmp / "report.html")], ours),
    }
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for i in range(args.repeat):
        order = list(commands) if i % 2 == 0 else list(reversed(commands))
        for name in order:
            argv, env = commands[name]
            seconds, rss, out = run(argv, env, tmp)  # from tmp: the repository root would shadow the install
            runs[name].append((seconds, rss))
            print(f"  {i + 1}/{args.repeat} {name:<8} {seconds:6.2f} s  {rss:6.0f} MB  {out.strip()[:120]}")
    print(f"end: {load()}")
    report(runs, events)


def report(runs: dict[str, list[tuple[float, float]]], events: int) -> None:
    peer = statistics.median(s for s, _ in runs["peer"])
    print(f"medians of {len(runs['peer'])} (wall, interpreter start included; peak RSS the largest):")
    for name, measured in runs.items():
        seconds = statistics.median(s for s, _ in measured)
        rss = max(r for _, r in measured)
        ratios = sorted(peer_s / s for (peer_s, _), (s, _) in zip(runs["peer"], measured, strict=True))
        line = (f"  {name:<8} {seconds:6.2f} s  {events / seconds:>9,.0f} events/s  {rss:5.0f} MB  "
                f"{peer / seconds:5.2f}x the peer (pairs: {ratios[0]:.2f}-{ratios[-1]:.2f}x)")
        if name in TARGETS:
            times, mb = TARGETS[name]
            met = peer / seconds >= times and rss <= mb and (name != "sidecar" or events / seconds >= MIN_RATE)
            line += f"  {'PASS' if met else 'FAIL'} (>= {times:g}x, <= {mb:g} MB"
            line += f", >= {MIN_RATE:,} events/s)" if name == "sidecar" else ")"
        print(line)


if __name__ == "__main__":
    main()
