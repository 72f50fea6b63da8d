"""``nvrx-slo ft-launcher ARGS…``: NVRx's ft_launcher, unchanged, with its own events journaled.

Every argument goes to ``nvidia_resiliency_ext.fault_tolerance.launcher.main`` untouched (a
wrong flag is reported by ft_launcher's own parser, naming the flag). Before calling it, this
entry point installs two handlers through torchelastic's public extension points — nothing is
patched on disk or in memory:

* a torchelastic *metrics* handler (``metrics.configure``): the agent publishes
  ``workers.<role>.<state>`` every monitor cycle and ``<Agent>.<method>.duration.ms`` when each
  profiled method returns; and
* a *rendezvous events* handler (the ``dynamic_rendezvous`` log destination).

They map to journal events (``rank`` null) at the instant they happen:

=================================== ===============================================================
``launcher_failure_detected``       the monitor saw the worker group FAILED or UNHEALTHY
``launcher_workers_terminated``     ``_stop_workers`` returned (all local workers are gone)
``launcher_rendezvous_start``       the node asks to join the next rendezvous round
``launcher_rendezvous_done``        the node joined the round (ranks assigned)
``launcher_worker_start``           ``_start_workers`` returned (new worker processes exist)
``launcher_worker_exit``            a worker process ended: the kernel's instant (``WorkerExits``)
``launcher_metric``                 every other metric, when its value changes (``name``, ``value``)
=================================== ===============================================================

The launcher's ``restart`` field counts detected failures, so the events of recovering from the
k-th failure carry ``restart`` = k, the ``TORCHELASTIC_RESTART_COUNT`` of the workers it starts.
The journal directory comes from ``$NVRX_SLO_JOURNAL_DIR`` (ft_launcher owns the command line).
"""

from __future__ import annotations

import json
import logging
import os
import select
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer import nvrx_compat
from nvrx_slo.trainer.journal import Journal, open_journal, process_start_mono

_FAILED_STATES = ("failed", "unhealthy")
_NOISY = ("_monitor_workers", "remaining_restarts")  # published every monitor cycle; unchanged values skipped


class LauncherJournal:
    """Turns torchelastic metrics and rendezvous events into launcher journal events."""

    def __init__(self, journal: Journal, workers_started: Callable[[], None] = lambda: None) -> None:
        self.journal = journal
        self.workers_started = workers_started  # e.g. WorkerExits.watch
        self.failures = 0
        self._last: dict[str, Any] = {}
        self._state: str | None = None
        self._lock = threading.Lock()

    def metric(self, name: str, value: Any) -> None:
        """One torchelastic metric data point (group ignored: names are unique)."""
        try:
            with self._lock:
                self._metric(name, value)
        except Exception:  # never raise into the launcher
            self.journal.errors += 1

    def _metric(self, name: str, value: Any) -> None:
        parts = name.split(".")
        if parts[0] == "workers" and len(parts) == 3 and parts[2] not in ("remaining_restarts", "run_total"):
            state = parts[2]
            if state in _FAILED_STATES and self._state not in _FAILED_STATES:
                self.journal.emit(EventType.LAUNCHER_FAILURE_DETECTED)
                self.failures += 1
                self.journal.update(restart=self.failures)
            self._state = state
            return
        if name.endswith("._stop_workers.duration.ms"):
            self.journal.emit(EventType.LAUNCHER_WORKERS_TERMINATED)
        elif name.endswith("._start_workers.duration.ms"):
            self.journal.emit(EventType.LAUNCHER_WORKER_START)
            self.workers_started()
        if any(noisy in name for noisy in _NOISY) and self._last.get(name) == value:
            return
        self._last[name] = value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self.journal.emit(EventType.LAUNCHER_METRIC, name=name, value=value)

    def rendezvous_event(self, serialized: str) -> None:
        """One torchelastic ``RdzvEvent`` (JSON) from the rendezvous handler."""
        try:
            event = json.loads(serialized)
            if not str(event.get("name", "")).endswith(".next_rendezvous") or event.get("node_state") != "RUNNING":
                return
            if event.get("rank") is None:
                self.journal.emit(EventType.LAUNCHER_RENDEZVOUS_START)
            else:
                self.journal.emit(EventType.LAUNCHER_RENDEZVOUS_DONE)
        except Exception:  # never raise into the launcher
            self.journal.errors += 1


class WorkerExits:
    """Journals each worker process's end at the instant the kernel reports it.

    A worker killed from outside (the OOM killer, a node agent) writes nothing of its own death;
    its exit is the fault's instant. ``watch()`` (after workers start) opens a pidfd for every
    child process not yet watched; a daemon thread polls them and writes
    ``launcher_worker_exit`` when one becomes readable (the process ended), within milliseconds.
    Never raises into the launcher; without pidfds (Linux < 5.3) it does nothing.
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._poll = select.poll()
        self._wake_r, self._wake_w = os.pipe()
        self._poll.register(self._wake_r, select.POLLIN)
        self._fds: dict[int, int] = {}  # pidfd -> pid
        self._watched: set[int] = set()
        self._new: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="nvrx-slo-worker-exits", daemon=True).start()

    def watch(self) -> None:
        try:
            for pid in _children() - self._watched:
                self._watched.add(pid)
                try:
                    fd = os.pidfd_open(pid)
                except ProcessLookupError:  # already gone and reaped
                    continue
                with self._lock:
                    self._new.append((fd, pid))
            os.write(self._wake_w, b"x")
        except Exception:  # never raise into the launcher
            self.journal.errors += 1

    def _run(self) -> None:
        while True:
            try:
                for fd, _ in self._poll.poll():
                    if fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                        with self._lock:
                            new, self._new = self._new, []
                        for pidfd, pid in new:
                            self._fds[pidfd] = pid
                            self._poll.register(pidfd, select.POLLIN)
                        continue
                    self.journal.emit(EventType.LAUNCHER_WORKER_EXIT, worker_pid=self._fds.pop(fd))
                    self._poll.unregister(fd)
                    os.close(fd)
            except Exception:  # never raise; keep watching
                self.journal.errors += 1
                time.sleep(0.1)


def _children() -> set[int]:
    """This process's child processes (each thread's ``children`` list, Linux >= 3.5)."""
    pids: set[int] = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            continue
    return pids


def install(target: LauncherJournal) -> bool:
    """Register ``target`` with torchelastic's metrics and rendezvous-event handlers."""
    for elastic in nvrx_compat.elastic():
        metrics = elastic.metrics

        class MetricHandler(metrics.MetricHandler):  # type: ignore[name-defined]
            def emit(self, metric_data: Any) -> None:
                target.metric(metric_data.name, metric_data.value)

        class RendezvousHandler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                target.rendezvous_event(record.getMessage())

        metrics.configure(MetricHandler())  # the default group: every put_metric and @prof
        elastic.event_handlers["dynamic_rendezvous"] = RendezvousHandler()
    return bool(nvrx_compat.elastic())


def _launch_counts(launcher: Any, argv: list[str]) -> dict[str, int | None]:
    """``--max-restarts``, ``--nproc-per-node`` and the world size as ft_launcher parses them
    (None where not a number: ``auto``, ``gpu``, an elastic ``--nnodes 2:4``)."""
    try:
        args, _ = launcher.get_args_parser().parse_known_args(argv)
    except (Exception, SystemExit):
        return {"max_restarts": None, "local_world_size": None, "world_size": None}
    local = _int(args.nproc_per_node)
    low, _, high = str(args.nnodes).partition(":")
    nodes = _int(low) if high in ("", low) else None
    return {"max_restarts": _int(args.max_restarts), "local_world_size": local,
            "world_size": None if local is None or nodes is None else nodes * local}


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    launcher = nvrx_compat.launcher()
    if launcher is None:
        print("nvrx-slo ft-launcher: nvidia-resiliency-ext is not installed", file=sys.stderr)
        return 2
    journal = open_journal(launcher=True)
    target = LauncherJournal(journal, WorkerExits(journal).watch)
    install(target)
    # dated when the container's process started, not after the imports above (seconds under load)
    started = process_start_mono()
    journal.emit_first(EventType.LAUNCHER_START, started if started is not None else time.monotonic(),
                       **_launch_counts(launcher, argv))
    code = 1
    sys.argv = ["nvrx-slo ft-launcher", *argv]  # ft_launcher's usage and errors name this command
    try:
        launcher.main(argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        journal.emit(EventType.LAUNCHER_EXIT, code=code)
        journal.close()
    # The workers are gone and the exit is journaled: end here. Tearing down the interpreter (torch,
    # NVRx) takes 0.5-3 s that the container is still billed for and no record would cover.
    os._exit(code)
