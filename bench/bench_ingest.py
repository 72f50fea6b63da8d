"""Ingest benchmark: replay a generated ~1M-event journal through the sidecar's reader and engine, on one core.

Side by side, in one run, over the same files (each variant run ``--repeat`` times, interleaved,
best kept: the development machine is shared):
  json        read + ``schema.decode`` (stdlib json + the contract's validation) per line: the naive baseline
  tail        the sidecar's reader (merge by time, orjson, fast validation), records dropped
  tail+engine the sidecar's reader into the accounting engine (what the sidecar does)

With ``--before SITE`` (a tree installed with ``pip install --no-deps --target SITE``), tail+engine
also runs on that tree: each tree in a child process of its own (this script, the other tree
first on its path), alternating, ``--repeat`` times each, over the same files; the ratio of the
best runs is printed.

Usage: .venv/bin/python bench/bench_ingest.py [--events 1000000] [--ranks 8] [--repeat 3] [--dir DIR] [--before SITE]
Target (issue 3): tail+engine >= 200k events/s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: --before's tree comes first

from bench import synthetic_journal
from nvrx_slo.contracts import schema
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.live import Live

TARGET = 200_000


def naive(directory: Path) -> int:
    n = 0
    for path in sorted(directory.glob("*.jsonl")):
        with open(path, "rb") as f:
            for line in f:
                schema.decode(line)
                n += 1
    return n


def tail_only(directory: Path) -> int:
    return JournalTail(directory).poll(lambda records: None)


def tail_engine(directory: Path) -> int:
    live = Live(Engine(), JournalTail(directory))
    n = live.poll()
    snap = live.view().snapshot
    assert snap.events_accepted == n, (snap.events_accepted, n)
    return n


def timed(fn, directory: Path) -> tuple[int, float]:
    start = time.perf_counter()
    n = fn(directory)
    return n, time.perf_counter() - start


def in_child(directory: Path, site: Path | None) -> tuple[int, float]:
    """``tail_engine`` in a process of its own, on this tree or on the one installed at ``site``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if site is not None:
        env["PYTHONPATH"] = str(site)
    out = subprocess.run([sys.executable, __file__, "--measure", str(directory)], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), float(out[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--repeat", type=int, default=3, help="runs of each variant; the best counts")
    p.add_argument("--dir", type=Path, default=None, help="where to write the journal (default: a temp dir)")
    p.add_argument("--before", type=Path, default=None, help="a tree installed with pip --target, to compare")
    p.add_argument("--measure", type=Path, default=None, help=argparse.SUPPRESS)  # a child's one run: tail+engine
    args = p.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core
    if args.measure:
        print(*timed(tail_engine, args.measure))
        return
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.dir or Path(tmp) / "journal"
        steps = int(args.events / args.ranks / (1 + 3 / 50))  # step + a save (3 events) every 50 steps
        t = time.perf_counter()
        events = synthetic_journal.write(directory, args.ranks, steps, restart_at=steps // 2)
        size = sum(f.stat().st_size for f in directory.glob("*.jsonl"))
        print(f"journal: {events} events, {args.ranks} ranks, {size / 1e6:.0f} MB, generated in "
              f"{time.perf_counter() - t:.1f} s; one core (cpu {sorted(os.sched_getaffinity(0))[0]})")
        results: dict[str, float] = {}
        for _ in range(args.repeat):  # interleaved; best of N, as the machine may be shared
            for name, fn in (("json", naive), ("tail", tail_only), ("tail+engine", tail_engine)):
                n, seconds = timed(fn, directory)
                assert n == events, (name, n, events)
                results[name] = max(results.get(name, 0.0), n / seconds)
        base = results["json"]
        for name, rate in results.items():
            print(f"  {name:<12} {rate:>10,.0f} events/s  {1e6 / rate:5.2f} µs/event  ({rate / base:.2f}x json)")
        engine_us = 1e6 / results["tail+engine"] - 1e6 / results["tail"]
        print(f"  of which the engine {engine_us:.2f} µs/event, the reader {1e6 / results['tail']:.2f} µs/event")
        verdict = "PASS" if results["tail+engine"] >= TARGET else "FAIL"
        print(f"{verdict}: sidecar ingest {results['tail+engine']:,.0f} events/s (target >= {TARGET:,})")
        if args.before:
            best = {"this tree": 0.0, "before": 0.0}
            for _ in range(args.repeat):  # alternating, each in a fresh process
                for name, site in (("this tree", None), ("before", args.before)):
                    n, seconds = in_child(directory, site)
                    assert n == events, (name, n, events)
                    best[name] = max(best[name], n / seconds)
                    print(f"  tail+engine, {name:<9} {n / seconds:>10,.0f} events/s")
            print(f"side by side (best of {args.repeat} each, own processes): this tree {best['this tree']:,.0f}, "
                  f"before {best['before']:,.0f} events/s; ratio {best['this tree'] / best['before']:.3f}")


if __name__ == "__main__":
    main()
