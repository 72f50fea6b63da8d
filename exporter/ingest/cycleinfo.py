"""ft_launcher's cycle-info files, for NVRx versions that write them (``--ft-cycle-info-dir``).

Newer NVRx (not 0.4.1) has the rendezvous host write one JSON file per launcher cycle,
``cycle_info.<job_id>.<attempt>.<cycle>``, with ``cycle_start_time`` (after the rendezvous) and,
once the cycle is over, ``cycle_end_time`` (UTC ISO 8601). A job launched without this project's
``nvrx-slo ft-launcher`` wrapper has no launcher journal; these files give its restarts the same
phase boundaries. Each cycle becomes launcher records the engine already understands:

* cycle *n* > 0 started → ``launcher_rendezvous_done`` at its start;
* cycle *n* ended and cycle *n+1* exists → ``launcher_failure_detected`` at its end.

The files carry wall-clock times; the records' monotonic time is wall minus the sidecar's
current wall−monotonic offset (both clocks of the same node). Synthesized records carry
``pid`` 0 (no real process) and a ``seq`` kept in the sidecar's state, and each is emitted once.
Files that do not parse are logged (bounded) and retried: NVRx replaces them atomically.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from nvrx_slo.contracts import schema
from nvrx_slo.exporter.events import Event, as_event
from nvrx_slo.exporter.identity import PodIdentity
from nvrx_slo.exporter.ingest.ratelog import BoundedLog

log = logging.getLogger("nvrx_slo.cycleinfo")

FILE_NAME = re.compile(r"^cycle_info\.(?P<job>.+)\.(?P<attempt>\d+)\.(?P<cycle>\d+)$")
PID = 0  # synthesized from cycle info, not written by a process


def _wall(iso: str) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


class CycleInfoReader:
    def __init__(self, directory: Path, identity: PodIdentity, *, mono: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self._identity = identity
        self._mono = mono
        self._wall = wall
        self._emitted: set[str] = set()
        self._seq = 0
        self._log = BoundedLog(log)

    def to_state(self) -> dict[str, Any]:
        return {"emitted": sorted(self._emitted), "seq": self._seq}

    def load_state(self, state: dict[str, Any]) -> None:
        self._emitted = set(state["emitted"])
        self._seq = int(state["seq"])

    def poll(self) -> list[Event]:
        """Launcher events for what the cycle files say that was not emitted before."""
        cycles: dict[tuple[str, int, int], tuple[float | None, float | None]] = {}
        try:
            names = os.listdir(self.directory)
        except OSError as exc:
            self._log.warning("dir", "cannot list cycle-info directory %s: %s", self.directory, exc)
            return []
        for name in names:
            match = FILE_NAME.match(name)
            if match is None:
                continue  # the .current symlink, temporary files
            try:
                data = orjson.loads((self.directory / name).read_bytes())
                cycles[(match["job"], int(match["attempt"]), int(match["cycle"]))] = (
                    _wall(data["cycle_start_time"]), _wall(data["cycle_end_time"]))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self._log.warning(name, "cycle-info file %s unreadable (%s): retrying", name, exc)
        offset = self._wall() - self._mono()
        out = []
        for (job, attempt, cycle), (start, end) in sorted(cycles.items()):
            if cycle > 0 and start is not None:
                out += self._once(f"{job}/{attempt}/{cycle}/start", schema.EventType.LAUNCHER_RENDEZVOUS_DONE,
                                  job, cycle, start, offset)
            if end is not None and (job, attempt, cycle + 1) in cycles:
                out += self._once(f"{job}/{attempt}/{cycle}/failed", schema.EventType.LAUNCHER_FAILURE_DETECTED,
                                  job, cycle, end, offset)
        return out

    def _once(self, key: str, kind: schema.EventType, job: str, cycle: int, wall: float,
              offset: float) -> list[Event]:
        if key in self._emitted:
            return []
        self._emitted.add(key)
        record = {"v": schema.SCHEMA_VERSION, "type": kind.value, "seq": self._seq, "mono": wall - offset,
                  "wall": wall, "job": self._identity.job_name or job, "pod": self._identity.pod,
                  "node": self._identity.node, "rank": None, "local_rank": None, "pid": PID, "restart": cycle,
                  "iter": 0}
        self._seq += 1
        return [as_event(record)]
