"""A synthetic pod journal for benchmarks: ranks stepping, saving asynchronously, one in-job restart.

Shaped like the reference job's journal (same event types and payloads, one file per process),
but written directly, fast, at any size: ``write(directory, ranks, steps)``, or
``python bench/synthetic_journal.py DIR --ranks R --steps N [--restart-at S]``.
``tests/test_synthetic_journal.py`` checks that its accounting means what the records say.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from nvrx_slo.contracts import schema

WALL_OFFSET = 1.7e9


class _Proc:
    def __init__(self, directory: Path, pod: str, rank: int | None, pid: int, restart: int) -> None:
        self.path = directory / schema.journal_file_name(pod, rank, pid)
        self.common = {"job": "bench", "pod": pod, "node": "node-0", "rank": rank, "local_rank": rank,
                       "pid": pid, "restart": restart, "iter": 0}
        self.seq = 0
        self.lines: list[bytes] = []

    def ev(self, type_: str, mono: float, **payload: object) -> None:
        self.lines.append(schema.encode({"v": 1, "type": type_, "seq": self.seq, "mono": mono,
                                         "wall": mono + WALL_OFFSET, **self.common, **payload}))
        self.seq += 1

    def flush(self) -> None:
        with open(self.path, "ab") as f:
            f.write(b"".join(self.lines))
        self.lines.clear()


def write(directory: str | os.PathLike[str], ranks: int, steps: int, *, pod: str = "pod-0", step_s: float = 0.5,
          checkpoint_every: int = 50, restart_at: int | None = None) -> int:
    """Write the journal; returns the number of events. ``restart_at``: an in-job restart when the
    ranks are about to run that step.

    Coherent, so that what any tool accounts from it means something: a save's end is journaled
    when the trainer would observe it (two steps after it was scheduled), a killed worker's save
    still in flight never ends, the restarted worker restores the newest durable save and runs the
    steps after it again (the steps since are lost work), and the launcher exits after the last
    record. The job ends before now on this machine's monotonic clock, as a journal read after the
    fact does: the sidecar rejects records from its clock's future as implausible."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    redone = 0 if restart_at is None else restart_at
    longest = 5.0 + (steps + redone + 2) * step_s + (steps + redone) // checkpoint_every * 0.02
    origin = time.monotonic() - (longest + 60.0)
    launcher = _Proc(directory, pod, None, 10, 0)
    launcher.ev("launcher_start", origin, max_restarts=3)
    launcher.ev("launcher_worker_start", origin + 0.1)
    events, end, fault = 2, origin, None
    for rank in range(ranks):
        t = origin + 1.0
        proc = _Proc(directory, pod, rank, 1000 + rank, 0)
        proc.ev("process_start", t, world_size=ranks)
        proc.ev("restore", t + 1.0, start=t + 0.5, step=None, path=None, fallback=None)
        t += 1.0
        step, durable, restarted = 1, None, False
        pending: tuple[str, int, float, float] | None = None  # a save in flight: ckpt, step, written, observed
        while step <= steps:
            if step == restart_at and not restarted:  # the worker is killed; its launcher starts another
                fault, restarted, pending = t, True, None
                proc.flush()
                events += proc.seq
                t += 2.0
                proc = _Proc(directory, pod, rank, 5000 + rank, 1)
                proc.ev("process_start", t, world_size=ranks)
                proc.ev("restore", t + 1.0, start=t + 0.2, step=durable, path=None if durable is None else "/ckpt",
                        fallback=None)
                t += 1.0
                step = (durable or 0) + 1
                continue
            start, t = t, t + step_s
            proc.ev("step", t, step=step, start=start, data_s=0.01, compute_s=step_s * 0.8, optimizer_s=step_s * 0.1)
            if pending is not None and pending[3] <= t:
                ckpt, saved, written, _ = pending
                proc.ev("checkpoint_end", t, ckpt=ckpt, step=saved, ok=True, written=written, error=None)
                durable, pending = saved, None
            if step % checkpoint_every == 0:
                ckpt = f"step-{step:06d}"
                proc.ev("checkpoint_start", t, ckpt=ckpt, step=step, mode="async")
                t += 0.02
                proc.ev("checkpoint_scheduled", t, ckpt=ckpt, plan_s=0.005, stage_s=0.015, bytes=1 << 20)
                pending = (ckpt, step, t + step_s, t + 2 * step_s)
            step += 1
        if pending is not None:  # the last save: the trainer waits for it before it exits
            ckpt, saved, written, observed = pending
            t = max(t, observed)
            proc.ev("checkpoint_end", t, ckpt=ckpt, step=saved, ok=True, written=written, error=None)
        proc.ev("process_end", t + 0.1)
        proc.flush()
        events += proc.seq
        end = max(end, t + 0.1)
    if fault is not None:
        for rank in range(ranks):
            launcher.ev("launcher_worker_exit", fault + 0.01, worker_pid=1000 + rank)
        launcher.ev("launcher_failure_detected", fault + 0.3)
        launcher.ev("launcher_worker_start", fault + 1.5)
        events += ranks + 2
    launcher.ev("launcher_exit", end + 0.2, code=0)
    launcher.flush()
    return events + 1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--restart-at", type=int, default=None, help="an in-job restart before this step (default: none)")
    args = p.parse_args()
    print(write(args.directory, args.ranks, args.steps, restart_at=args.restart_at), "events")


if __name__ == "__main__":
    main()
