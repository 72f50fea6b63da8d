"""Offline report benchmark: peak memory and time of `nvrx-slo report` on a generated ~1M-event journal.

The journal is ``bench/synthetic_journal.py``'s (run as its command): by default one rank stepping 943,396 times with a
save every 50 steps and one in-job restart (1,000,055 events, 262 MB). Each run is the real command
in a child process, its peak RSS read from the kernel (``wait4``). With ``--before SITE`` (a tree
installed with ``pip install --no-deps --target SITE``), that tree runs the same command on the same
journal, alternating with this one.

Usage: .venv/bin/python bench/bench_report.py [--ranks 1] [--steps 943396] [--restart-at 471698]
       [--repeat 2] [--before SITE] [--dir DIR]
Target (issue 25): peak RSS <= 268 MB.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_MB = 268.0
GENERATOR = Path(__file__).resolve().parent / "synthetic_journal.py"


def run(journal: Path, out: Path, site: Path | None) -> tuple[float, float]:
    """One `nvrx-slo report` of ``journal``: its peak RSS (MB) and wall time (s)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if site is not None:
        env["PYTHONPATH"] = str(site)  # ahead of this tree's editable install
    start = time.perf_counter()
    # run from the journal's directory: from the repository root, ``-m`` would import its nvrx_slo/ first
    proc = subprocess.Popen([sys.executable, "-m", "nvrx_slo", "report", str(journal), "-o", str(out)], env=env,
                            cwd=journal.parent, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, f"nvrx-slo report exited {proc.returncode}"
    return usage.ru_maxrss / 1024, elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--steps", type=int, default=943_396)
    p.add_argument("--restart-at", type=int, default=471_698)
    p.add_argument("--repeat", type=int, default=2, help="runs of each tree, alternating")
    p.add_argument("--before", type=Path, default=None, help="a tree installed with pip --target, to compare")
    p.add_argument("--dir", type=Path, default=None, help="where to write the journal (default: a temp dir)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        journal = args.dir or Path(tmp) / "journal"
        # written by a child of its own: a report forked from a parent holding the journal would count
        # the parent's pages in its peak
        made = subprocess.run([sys.executable, str(GENERATOR), str(journal), "--ranks", str(args.ranks), "--steps",
                               str(args.steps), "--restart-at", str(args.restart_at)],
                              capture_output=True, text=True, check=True)
        events = int(made.stdout.split()[0])
        size = sum(f.stat().st_size for f in journal.glob("*.jsonl"))
        print(f"journal: {events:,} events, {args.ranks} rank(s), {size / 1e6:.0f} MB")
        trees = {"this tree": None, **({"before": args.before} if args.before else {})}
        peaks: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(args.repeat):
            for name, site in trees.items():
                rss, seconds = run(journal, Path(tmp) / "report.html", site)
                peaks[name].append(rss)
                print(f"  {name:<10} peak RSS {rss:6.0f} MB  {seconds:5.1f} s")
        worst = max(peaks["this tree"])
        verdict = "PASS" if worst <= TARGET_MB else "FAIL"
        print(f"{verdict}: report peak RSS {worst:.0f} MB (target <= {TARGET_MB:.0f} MB)")


if __name__ == "__main__":
    main()
