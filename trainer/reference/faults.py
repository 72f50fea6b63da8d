"""Fault injection for the reference job: crash, exception, hang — each at most once per run.

A fault fires on one rank at the start of its step, after a ``fault_injected`` record, and only
the first time any incarnation of the job reaches that step: a marker file under the checkpoint
directory remembers it, so a job restarted from an earlier checkpoint does not crash-loop.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from pathlib import Path

from nvrx_slo import Hooks

KINDS = ("crash", "exception", "hang")


class InjectedFault(RuntimeError):
    """The exception the ``exception`` fault raises (an in-process restart under inprocess.Wrapper)."""


@dataclasses.dataclass(frozen=True)
class Fault:
    kind: str  # one of KINDS
    step: int


class FaultInjector:
    def __init__(self, faults: list[Fault], rank: int, fault_rank: int, marker_dir: Path) -> None:
        self.faults = {f.step: f for f in faults} if rank == fault_rank else {}
        self.marker_dir = marker_dir

    def before_step(self, hooks: Hooks, step: int) -> None:
        fault = self.faults.get(step)
        if fault is None:
            return
        marker = self.marker_dir / f"{fault.kind}-{fault.step}"
        try:
            self.marker_dir.mkdir(parents=True, exist_ok=True)
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # already injected by an earlier incarnation
        hooks.fault_injected(fault.kind, step)
        if fault.kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "exception":
            raise InjectedFault(f"injected exception at step {step}")
        elif fault.kind == "hang":
            while True:
                time.sleep(60)
