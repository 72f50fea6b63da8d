"""A fake GPU for the hooks' CUDA step timing: one stream on a virtual host clock.

The fake is the seam ``cuda_timing.DeviceEvent``: kernels queue behind each other, an event completes
when the stream reaches it, and ``elapsed_time`` raises for an event not yet reached, as CUDA does.
Host and GPU share the virtual clock (``virtual_clock.CLOCK``, under the ``virtual_time`` fixture):
sleeping advances it, so the numbers are exact on any machine, however loaded. What the fake cannot
tell is what a real GPU costs (``bench/gpu_check.py``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from nvrx_slo.contracts import schema
from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.engine.snapshot import RankSnapshot
from nvrx_slo.exporter.events import as_event
from virtual_clock import CLOCK


def _sleep_until(instant: float) -> None:
    CLOCK.sleep(max(0.0, instant - CLOCK()))


class FakeGpu:
    """One CUDA stream on the host's monotonic clock; ``calls`` lists what the hooks asked of its events."""

    def __init__(self) -> None:
        self.tail = 0.0  # when the stream finishes what is queued
        self.calls: list[str] = []
        self.broken: str | None = None  # an event method that raises, like a sticky CUDA error

    def run(self, seconds: float) -> None:
        """A kernel launch: returns at once, the work queues behind the stream's."""
        self.tail = max(self.tail, CLOCK()) + seconds

    def synchronize(self) -> None:
        """What a staging copy, an H2D copy or ``.item()`` does: the host waits for the stream."""
        _sleep_until(self.tail)

    def event(self) -> FakeEvent:
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.at: float | None = None  # when the stream reaches it

    def _call(self, name: str) -> None:
        self.gpu.calls.append(name)
        if self.gpu.broken == name:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def _done(self) -> bool:
        assert self.at is not None, "never recorded"
        return CLOCK() >= self.at

    def record(self, stream: object = None) -> None:
        self._call("record")
        self.at = max(self.gpu.tail, CLOCK())

    def query(self) -> bool:
        self._call("query")
        return self._done()

    def synchronize(self) -> None:
        self._call("synchronize")
        assert self.at is not None
        _sleep_until(self.at)

    def elapsed_time(self, end_event: FakeEvent) -> float:
        self._call("elapsed_time")
        if not (self._done() and end_event._done()):
            raise RuntimeError("CUDA error: device not ready")
        assert self.at is not None and end_event.at is not None
        return (end_event.at - self.at) * 1000.0


def read_records(directory: Path) -> list[dict[str, Any]]:
    """Every record of the journal files in ``directory``, file by file."""
    return [schema.decode(line) for path in sorted(directory.iterdir()) for line in path.read_bytes().splitlines()]


def rank_accounted(directory: Path) -> RankSnapshot:
    """The sidecar engine's snapshot of the one rank journaling in ``directory``."""
    engine = Engine(reorder_window_s=0.0)
    for record in read_records(directory):
        engine.ingest(as_event(record))
    return engine.snapshot(CLOCK(), time.time()).ranks[0]


def accounted(directory: Path) -> dict[Category, float]:
    """The seconds the sidecar's engine books for the one rank journaling in ``directory``."""
    return rank_accounted(directory).seconds
