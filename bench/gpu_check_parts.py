"""What the GPU check's sections share (``gpu_check.py``): its table, the stream its loops launch work
on, and the sidecar's engine over a journal.

The stream is CUDA's current one where there is a GPU, and without one the simulated CUDA device of
the tests (``tests/sim_cuda.py``) on the host's real clock: work queues behind work, an event
completes when the stream reaches it, and the hooks find it as ``torch.cuda`` (``device()``), so
their CUDA path runs as it would on a GPU, minus what a GPU's calls cost.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.ingest.tail import JournalTail

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from journal_truth import read_journal
from sim_cuda import RealClock, SimCuda, installed

CUDA = torch.cuda.is_available()
PLANT = {"data": 0.008, "compute": 0.012, "optimizer": 0.004}  # (b), (e): seconds per step


class Row(dict[str, Any]):
    """One line of the table: section, what, measured, target, verdict."""


ROWS: list[Row] = []


def row(section: str, what: str, measured: str, target: str = "", verdict: str = "measured", **numbers: Any) -> None:
    ROWS.append(Row(section=section, what=what, measured=measured, target=target, verdict=verdict, **numbers))
    print(f"  ({section}) {what}: {measured} {verdict}", flush=True)


def skip(section: str, why: str) -> None:
    row(section, "skipped", why, verdict="skipped")


class SimStream:
    """The CPU fallback: one stream of a simulated GPU on the host's real clock."""

    def __init__(self) -> None:
        self.cuda = SimCuda(RealClock())  # CUDA not initialised until work is launched

    def run(self, seconds: float) -> None:
        self.cuda.run(seconds)

    def synchronize(self) -> None:
        self.cuda.item()

    def event(self) -> Any:
        return self.cuda.Event(enable_timing=True)

    def device(self) -> contextlib.AbstractContextManager[Any]:
        """The simulated device as ``torch.cuda``, for the hooks, while a loop runs."""
        return installed(self.cuda)


class CudaStream:
    """The current CUDA stream, with ``torch.cuda._sleep`` (a spinning kernel) as planted work."""

    def __init__(self) -> None:
        begin, end = self.event(), self.event()
        begin.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        self.cycles_per_s = 10_000_000 / (begin.elapsed_time(end) / 1000.0)

    def run(self, seconds: float) -> None:
        torch.cuda._sleep(int(seconds * self.cycles_per_s))

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def event(self) -> Any:
        return torch.cuda.Event(enable_timing=True)

    def device(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()


def new_stream() -> SimStream | CudaStream:
    return CudaStream() if CUDA else SimStream()


def timed(fn: Callable[[], Any], truth: dict[str, float], charge: str | None) -> None:
    """Run ``fn``, adding its time on the loop's clock to ``truth[charge]`` (if any). On a GPU the
    steps' queued work is waited for first: it is theirs (the hooks fence there too)."""
    if CUDA:
        torch.cuda.synchronize()
    t0 = time.monotonic()
    fn()
    if charge is not None:
        truth[charge] += time.monotonic() - t0


def steps_of(directory: Path) -> list[dict[str, Any]]:
    return [r for r in read_journal(directory) if r["type"] == "step"]


def engine(*journals: Path) -> Engine:
    """The sidecar's engine over finished journals, everything settled (one derivation of each number)."""
    out = Engine(reorder_window_s=0.0, keep_history=True)
    for journal in journals:
        tail = JournalTail(journal)
        try:
            tail.poll(lambda events: [out.ingest(e) for e in events])
        finally:
            tail.close()
    return out
