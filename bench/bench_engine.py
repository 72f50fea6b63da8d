"""Engine costs, side by side in one run: decoding lines to events vs ``Engine.ingest`` per step event, and
``Engine.snapshot`` for a pod of many ranks.

    .venv/bin/python bench/bench_engine.py [--events 1000000] [--ranks 1024] [--before SITE [--repeat 3]]

Synthetic journals: ranks stepping in lock step (1 s steps), a save every 100 steps; records are
built as journal lines and decoded as the sidecar does (``nvrx_slo.exporter.ingest.decode``, a chunk at a time), so
decoding is measured on the real wire format. Times are this process's
CPU time (``time.process_time``): one core's cost, whatever else the machine is running.

With ``--before SITE`` (a tree installed with ``pip install --no-deps --target SITE``), both trees
run the same measurements, each in a child process of its own (this script, the other tree first
on its path), alternating, ``--repeat`` times each; the best of each and their ratio are printed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

from nvrx_slo.contracts.schema import encode
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.ingest.decode import decode_batch


def journal(ranks: int, steps: int, step_s: float = 1.0) -> Iterator[bytes]:
    """Lines of a pod: process_start per rank, then steps in lock step with a save every 100."""
    seq = dict.fromkeys(range(ranks), 0)

    def line(rank: int, kind: str, mono: float, **payload: object) -> bytes:
        seq[rank] += 1
        return encode({"v": 1, "type": kind, "seq": seq[rank] - 1, "mono": mono, "wall": 1.7e9 + mono,
                       "job": "bench", "pod": "bench-0", "node": "n0", "rank": rank, "local_rank": rank % 8,
                       "pid": 1000 + rank, "restart": 0, "iter": 0, **payload})

    t = 1.0
    for rank in range(ranks):
        yield line(rank, "process_start", 0.5, world_size=ranks)
    for step in range(1, steps + 1):
        for rank in range(ranks):
            yield line(rank, "step", t + step_s, step=step, start=t, data_s=0.01, compute_s=0.8, optimizer_s=0.1)
        t += step_s
        if step % 100 == 0:
            ckpt = f"step-{step:06d}"
            for rank in range(ranks):
                yield line(rank, "checkpoint_start", t, ckpt=ckpt, step=step, mode="async")
                yield line(rank, "checkpoint_scheduled", t + 0.02, ckpt=ckpt, plan_s=0.0, stage_s=0.02, bytes=1 << 20)
            t += 0.02
            for rank in range(ranks):
                yield line(rank, "checkpoint_end", t + 0.5, ckpt=ckpt, step=step, ok=True, written=t + 0.4, error=None)


def bench_ingest(events: int, chunk: int = 100_000) -> float:
    """Decode and ingest in chunks (a chunk of decoded events at a time, not the whole journal)."""
    lines = journal(8, events // 8)
    engine = Engine()
    decode_s = ingest_s = 0.0
    n = 0
    while batch := list(itertools.islice(lines, chunk)):
        t0 = time.process_time()
        events = decode_batch([line[:-1] for line in batch])
        t1 = time.process_time()
        for event in events:
            engine.ingest(event)
        t2 = time.process_time()
        decode_s, ingest_s, n = decode_s + t1 - t0, ingest_s + t2 - t1, n + len(batch)
    decode_us, ingest_us = decode_s / n * 1e6, ingest_s / n * 1e6
    print(f"ingest   {n:,} events, 8 ranks: decode {decode_us:.2f} µs/event, Engine.ingest {ingest_us:.2f} "
          f"µs/event (ingest/decode = {ingest_us / decode_us:.1f}x); both: {n / (decode_s + ingest_s):,.0f} events/s")
    return ingest_us


def bench_snapshot(ranks: int) -> float:
    engine = Engine()
    for event in decode_batch([line[:-1] for line in journal(ranks, 250)]):
        engine.ingest(event)
    now = 260.0
    engine.snapshot(now, now)  # warm
    runs = 5
    t0 = time.process_time()
    for _ in range(runs):
        snap = engine.snapshot(now, now)
    ms = (time.process_time() - t0) / runs * 1e3
    print(f"snapshot {ranks} ranks: {ms:.1f} ms per snapshot ({sum(r.steps for r in snap.ranks):,} steps ingested, "
          f"efficiency {snap.efficiency:.3f})")
    return ms


def in_child(args: argparse.Namespace, site: str | None) -> dict[str, float]:
    """Both measurements in a process of its own, on this tree or on the one installed at ``site``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if site is not None:
        env["PYTHONPATH"] = site
    out = subprocess.run([sys.executable, __file__, "--events", str(args.events), "--ranks", str(args.ranks), "--json"],
                         env=env, capture_output=True, text=True, check=True).stdout
    result: dict[str, float] = json.loads(out.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000, help="step events to ingest")
    parser.add_argument("--ranks", type=int, default=1024, help="ranks in the snapshot benchmark")
    parser.add_argument("--before", default=None, help="a tree installed with pip --target, to compare")
    parser.add_argument("--repeat", type=int, default=3, help="with --before: runs of each tree, alternating")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a child's run: its numbers last
    args = parser.parse_args()
    if not args.before:
        numbers = {"ingest_us": bench_ingest(args.events), "snapshot_ms": bench_snapshot(args.ranks)}
        if args.json:
            print(json.dumps(numbers))
        return
    best: dict[str, dict[str, float]] = {"this tree": {}, "before": {}}
    for _ in range(args.repeat):
        for name, site in (("this tree", None), ("before", args.before)):
            got = in_child(args, site)
            print(f"{name:<9}  Engine.ingest {got['ingest_us']:.2f} µs/event  snapshot of {args.ranks} ranks "
                  f"{got['snapshot_ms']:.1f} ms")
            best[name] = {k: min(v, best[name].get(k, v)) for k, v in got.items()}
    now, before = best["this tree"], best["before"]
    print(f"best of {args.repeat}: Engine.ingest {now['ingest_us']:.2f} against {before['ingest_us']:.2f} µs/event "
          f"(ratio {now['ingest_us'] / before['ingest_us']:.3f}); snapshot {now['snapshot_ms']:.1f} against "
          f"{before['snapshot_ms']:.1f} ms (ratio {now['snapshot_ms'] / before['snapshot_ms']:.3f})")


if __name__ == "__main__":
    main()
