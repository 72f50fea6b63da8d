"""The sidecar's one state, and the ``View`` (``nvrx_slo.exporter.views.view``) every output renders from it.

The engine, the journal reader's counters and the two side inputs (NVML idle time, pod-watcher
restarts) change under one lock, and ``view()`` copies all of them at one instant. /metrics, OTLP
and the status page each render that ``View``: there is no second instrumentation path to drift.

The clock a view is taken at is the *read horizon*: the instant the last complete journal poll
began. Every record written before it has been read, so a job's end read later lies after every
instant a view has already counted wall to (see ``nvrx_slo.exporter.engine.engine``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from nvrx_slo.exporter.engine.engine import Engine, IngestFailed
from nvrx_slo.exporter.events import Event
from nvrx_slo.exporter.ingest.cycleinfo import CycleInfoReader
from nvrx_slo.exporter.ingest.podwatch import ContainerStatus, restart_deltas
from nvrx_slo.exporter.ingest.ratelog import BoundedLog
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.views.view import AcceleratorsSaid, View

# How far a record may lie in the future of the sidecar's monotonic clock: replays of a recorded
# run stamp lines minutes ahead (tests/test_sidecar_demo.py); one 8000 s ahead stretches wall for good.
FUTURE_SLACK_S = 600.0

log = logging.getLogger("nvrx_slo.live")


class Live:
    def __init__(self, engine: Engine, tail: JournalTail, *, cycles: CycleInfoReader | None = None,
                 mono: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self.lock = threading.Lock()
        self.engine = engine
        self.tail = tail
        self.cycles = cycles  # ft_launcher cycle-info files, when asked for
        self.gpu_idle_nvml: dict[int, float] = {}
        self.pod_restarts: Counter[tuple[str, str]] = Counter()
        self.pod_seen: dict[str, int] = {}  # container -> restartCount last reported
        self.engine_errors = 0  # valid records the engine raised on (each skipped, logged)
        self.accelerators = AcceleratorsSaid()  # what the pod holds: the sidecar says at start
        self._log = BoundedLog(log)
        self._mono = mono
        self._wall = wall
        self._horizon: tuple[float, float] | None = None  # (mono, wall) the last complete poll began at

    def poll(self, stop: Callable[[], bool] = lambda: False) -> int:
        """Read what the journal (and the cycle-info files) have new into the engine; see ``JournalTail.poll``."""
        began = (self._mono(), self._wall())
        handed = self.tail.poll(self._ingest, stop, guard=self.lock, not_after=self._not_after)
        if self.cycles is not None:
            records = self.cycles.poll()
            with self.lock:
                self._ingest(records)
            handed += len(records)
        if self.tail.directory_ok and self.tail.complete:  # read to the end: everything written before `began`
            with self.lock:
                self._horizon = began
        return handed

    def _not_after(self) -> float:
        """The writers share this node's CLOCK_MONOTONIC: a record from further ahead is forged or corrupt."""
        return self._mono() + FUTURE_SLACK_S

    def _ingest(self, events: list[Event]) -> None:  # called by the tail under self.lock
        not_after = self._not_after()
        while events:
            try:
                self.engine.ingest_many(events, not_after)
                return
            except IngestFailed as failed:  # an engine bug must not crash-loop the sidecar on the same line
                self.engine_errors += failed.end - failed.start
                event = events[failed.start]
                self._log.exception("engine", "engine failed on %s seq %s of pid %s: %d record(s) skipped",
                                    event.type, event.seq, event.pid, failed.end - failed.start)
                events = events[failed.end:]

    def settle(self) -> None:
        """The pod ends (SIGTERM): nothing more will be read, so nothing is held back (``Engine.settle``)."""
        with self.lock:
            self.engine.settle()

    def add_gpu_idle(self, idle_by_device: Mapping[int, float]) -> None:
        with self.lock:
            for device, seconds in idle_by_device.items():
                self.gpu_idle_nvml[device] = self.gpu_idle_nvml.get(device, 0.0) + seconds

    def observe_containers(self, statuses: list[ContainerStatus]) -> None:
        """A pod-watcher report: count the container restarts new since the last one."""
        with self.lock:
            self.pod_seen, new = restart_deltas(self.pod_seen, statuses)
            self.pod_restarts.update(new)

    def view(self) -> View:
        with self.lock:
            now = self._horizon if self._horizon is not None else (self._mono(), self._wall())  # before any poll
            # the poll thread is the only writer of tail.rejected; View.of copies it in one C call
            return View.of(self.engine.snapshot(*now), self.tail.rejected, engine_errors=self.engine_errors,
                           gpu_idle_nvml=self.gpu_idle_nvml, pod_restarts=self.pod_restarts,
                           accelerators=self.accelerators)

    # --- persistence (state_store saves these parts in one file) ------------------------------

    def to_state(self) -> dict[str, Any]:
        with self.lock:
            return {
                "engine": self.engine.to_state(),
                "tail": self.tail.to_state(),
                "gpu_idle_nvml": {str(k): v for k, v in self.gpu_idle_nvml.items()},
                "pod_restarts": [[c, r, n] for (c, r), n in self.pod_restarts.items()],
                "pod_seen": dict(self.pod_seen),
                "cycle_info": None if self.cycles is None else self.cycles.to_state(),
                "engine_errors": self.engine_errors,
            }

    def load_state(self, parts: dict[str, Any]) -> None:
        """Resume from ``to_state()``; raises ``ValueError``/``KeyError`` on a state that is not one."""
        engine = Engine.from_state(parts["engine"])
        with self.lock:
            self.engine = engine
            self.tail.load_state(parts["tail"])
            self.gpu_idle_nvml = {int(k): float(v) for k, v in parts["gpu_idle_nvml"].items()}
            self.pod_restarts = Counter({(c, r): int(n) for c, r, n in parts["pod_restarts"]})
            self.pod_seen = {c: int(n) for c, n in parts["pod_seen"].items()}
            self.engine_errors = int(parts["engine_errors"])
            if self.cycles is not None and parts["cycle_info"] is not None:
                self.cycles.load_state(parts["cycle_info"])
