"""A progress display for a running job: steps, checkpoints and restarts so far, from its journal.

The demo runs for minutes with faults injected on purpose; a person watching wants to see the
crash happen and the job come back. This follows the journal through the one replay
(``nvrx_slo.exporter.offline.replay``: the sidecar's reader into the sidecar's engine), viewed as
of the moment each read began, so the counts it shows are the ones /metrics and the SLO report
give. On a terminal it redraws one line in place; anywhere else (CI logs, a pipe) it prints a
plain line when a checkpoint or restart lands and at most every ``PLAIN_EVERY_S`` otherwise, so a
log holds a readable history instead of carriage-return noise.

Usage::

    with Progress(journal_dir):      # polls in a background thread
        run_the_job()
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from nvrx_slo.contracts.catalogue import RestartLevel
from nvrx_slo.exporter.engine.snapshot import Snapshot
from nvrx_slo.exporter.offline.replay import Replay

log = logging.getLogger("nvrx_slo.progress")

INTERVAL_S = 0.5
PLAIN_EVERY_S = 10.0


def summary(snap: Snapshot) -> str:
    """One line: where training is and what has happened to it so far."""
    step = snap.latest_step
    ck = snap.checkpoints
    restarts = snap.restarts_total
    by_level = ", ".join(f"{snap.restarts.counts[lvl]} {lvl.value}" for lvl in RestartLevel
                         if snap.restarts.counts.get(lvl, 0))
    if not snap.ranks:
        return "waiting for the job's first journal records"
    eff = snap.efficiency
    elapsed = 0.0 if snap.job_start_wall is None else max(0.0, snap.now_wall - snap.job_start_wall)
    parts = [
        f"{elapsed:5.0f} s",
        f"ranks {len(snap.ranks)}",
        "no step yet" if step is None else f"step {step}",
        f"checkpoints {ck.saves} durable" + (f", {ck.failures} failed" if ck.failures else "")
        + (f", {ck.in_flight} in flight" if ck.in_flight else ""),
        f"restarts {restarts}" + (f" ({by_level})" if by_level else ""),
        "efficiency —" if eff is None else f"efficiency {100 * eff:.1f}%",
    ]
    return " · ".join(parts)


class Progress:
    """Follow ``journal_dir`` and keep ``stream`` showing ``summary`` of it."""

    def __init__(self, journal_dir: str | Path, stream: TextIO | None = None, *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self._dir = Path(journal_dir)
        self._replay = Replay(journal_dir)
        self._wall = wall
        self._stream = stream if stream is not None else sys.stderr
        self._tty = self._stream.isatty()
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_events: tuple[int, ...] | None = None  # (saves, failures, restarts) last printed
        self._last_line_at = float("-inf")
        self._printed = ""  # the last plain line written
        self._failed = False

    def update(self) -> str:
        """Read what is new in the journal and redraw; returns the current summary line."""
        with self._lock:
            began = (self._clock(), self._wall())  # every record written before it is read below
            if self._dir.is_dir():  # the job creates it: until then there is nothing to read
                self._replay.poll()
            snap = self._replay.view(began).snapshot
            line = summary(snap)
            events = (snap.checkpoints.saves, snap.checkpoints.failures, snap.restarts_total)
            if self._tty:
                width = shutil.get_terminal_size().columns - 1
                self._stream.write("\r" + line[:width] + "\x1b[K")
                self._stream.flush()
            elif events != self._last_events or (line != self._printed
                                                 and self._clock() - self._last_line_at >= PLAIN_EVERY_S):
                self._print(line)
                self._last_events = events
            return line

    def _print(self, line: str) -> None:
        self._stream.write(line + "\n")
        self._stream.flush()
        self._printed, self._last_line_at = line, self._clock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="nvrx-slo-progress", daemon=True)
        self._thread.start()

    def stop(self) -> str:
        """Stop the thread, draw the final state (ending the redrawn line), return it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        line = self._draw()
        if self._tty:
            self._stream.write("\n")
            self._stream.flush()
        elif line is not None and line != self._printed:
            self._print(line)
        self._replay.close()
        return self._printed if line is None else line

    def _draw(self) -> str | None:
        """``update()``, or ``None`` where it failed: logged once, never raised."""
        try:
            return self.update()
        except Exception:  # a display must never take the job down with it
            if not self._failed:
                self._failed = True
                log.exception("progress display failed; the job goes on")
            return None

    def _run(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._draw()

    def __enter__(self) -> Progress:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
