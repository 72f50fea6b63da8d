"""``nvrx-slo ft-launcher ARGS…``: NVRx's ft_launcher, unchanged, with its own events journaled.

Every argument goes to ``nvidia_resiliency_ext.fault_tolerance.launcher.main`` untouched (a
wrong flag is reported by ft_launcher's own parser, naming the flag). Before calling it, this
entry point installs, with no file patched on disk and no function of NVRx's or torch's replaced:

* a torchelastic *metrics* handler (``metrics.configure``, public): the agent publishes
  ``workers.<role>.<state>`` every monitor cycle and ``<Agent>.<method>.duration.ms`` when each
  profiled method returns;
* a *rendezvous events* handler, set as the ``dynamic_rendezvous`` destination in torchelastic's
  registry of event log handlers (``events.handlers._log_handlers``, private: the one place those
  events are routed; ``nvrx_compat.elastic`` finds it, and says so when a release lacks it);
* a wakeup file descriptor for the stop signals (``StopSignals``), beside torchelastic's own handlers;
* the worker-exit timer (``WorkerExits``), which reads how each worker ended from the kernel.

They map to journal events (``rank`` null) at the instant they happen:

=================================== ===============================================================
``launcher_failure_detected``       the monitor saw the worker group FAILED or UNHEALTHY
``launcher_workers_terminated``     ``_stop_workers`` returned (all local workers are gone)
``launcher_rendezvous_start``       the node asks to join the next rendezvous round
``launcher_rendezvous_done``        the node joined the round (ranks assigned)
``launcher_worker_start``           ``_start_workers`` returned (new worker processes exist)
``launcher_worker_exit``            a worker process ended, timed as the kernel reported it (``WorkerExits``)
``launcher_signal``                 the launcher was told to stop (``StopSignals``)
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
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer import launch_env, nvrx_compat
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


# The exit timer: a process of its own (``python -I -S``, the standard library only), so that a
# worker's exit is timed as soon as the kernel reports it, whatever the launcher's threads are
# doing (one holding the interpreter lock, or preempted holding it, delayed a thread's reading of
# the clock by up to 0.11 s under load). It reads pids from stdin, one a line, and writes
# "pid mono status" when each exits, status being the wait status the kernel keeps for the exited
# process until its parent (the launcher) reaps it (/proc/PID/stat's last field; -1: reaped first);
# it ends when stdin closes (the launcher is gone).
_TIMER = r"""
import os, select, sys, time
poll, fds, pending = select.poll(), {}, b""
poll.register(0, select.POLLIN)
while True:
    ready = poll.poll()
    now = time.monotonic()
    out = []
    for fd, _ in ready:
        if fd != 0:
            pid = fds.pop(fd)
            try:
                with open("/proc/%d/stat" % pid, "rb") as f:
                    status = int(f.read().rsplit(b")", 1)[1].split()[-1])
            except (OSError, ValueError, IndexError):
                status = -1
            out.append(b"%d %r %d\n" % (pid, now, status))
            poll.unregister(fd)
            os.close(fd)
            continue
        data = os.read(0, 4096)
        if not data:
            sys.exit(0)
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            try:
                pidfd = os.pidfd_open(int(line))
            except (OSError, ValueError):  # gone and reaped already: no instant to give
                continue
            fds[pidfd] = int(line)
            poll.register(pidfd, select.POLLIN)
    if out:
        os.write(1, b"".join(out))
"""


class WorkerExits:
    """Journals each worker process's end at the instant the kernel reports it.

    A worker killed from outside (the OOM killer, a node agent) writes nothing of its own death;
    its exit is the fault's instant. ``watch()`` (after workers start) hands every child process
    not yet watched to the exit timer, a small process of its own that waits on their pidfds and
    reads the clock the moment one ends; a daemon thread here journals ``launcher_worker_exit``
    dated at that instant (``Journal.emit_at``), however late the thread itself runs. Linux gives
    no unprivileged process the kernel's own time of another's exit on this clock (the process
    connector, taskstats, BPF and process accounting need root; ``/proc/PID/sched`` keeps a
    per-CPU scheduler clock, measured up to 40 ms off here), so the instant is the timer's waking:
    the kernel's wake-up latency of a sleeping process, docs/robustness.md. How it ended (the
    signal, else the exit code: what its fault's cause is decided from) is read then too, from the
    exited process the launcher has not reaped yet (its monitor polls every ``--monitor-interval``).
    Never raises into the launcher; without pidfds (Linux < 5.3) or the timer, it does nothing.
    """

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._watched: set[int] = set()
        self._timer = subprocess.Popen([sys.executable, "-I", "-S", "-c", _TIMER], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, close_fds=True)
        self._watched.add(self._timer.pid)  # a child of this process, never a worker
        threading.Thread(target=self._run, name="nvrx-slo-worker-exits", daemon=True).start()

    def watch(self) -> None:
        try:
            new = _children() - self._watched
            self._watched |= new
            if new:
                assert self._timer.stdin is not None
                self._timer.stdin.write(b"".join(b"%d\n" % pid for pid in sorted(new)))
                self._timer.stdin.flush()
        except Exception:  # never raise into the launcher
            self.journal.errors += 1

    def _run(self) -> None:
        assert self._timer.stdout is not None
        for line in self._timer.stdout:  # until the timer ends
            try:
                pid, at, status = line.split()
                self.journal.emit_at(EventType.LAUNCHER_WORKER_EXIT, float(at), worker_pid=int(pid),
                                     **_how_it_ended(int(status)))
            except Exception:  # never raise; keep journaling
                self.journal.errors += 1


class StopSignals:
    """Journals the first SIGTERM, SIGINT and SIGHUP the launcher receives, as it receives it.

    The kubelet stops a pod with SIGTERM to its main process; torchelastic's handler then stops the
    workers, and reaps each at once, before the exit timer can read how it ended. So the signal is
    read where it arrives, without replacing anyone's handler: ``signal.set_wakeup_fd`` has the
    interpreter write each signal's number to a pipe whenever a Python handler (torchelastic's) is
    installed for it, and a daemon thread here journals it. Never raises into the launcher.
    """

    STOPS = frozenset({int(signal.SIGTERM), int(signal.SIGINT), int(signal.SIGHUP)})

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._seen: set[int] = set()
        read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)  # main thread only: main() runs there
        threading.Thread(target=self._run, args=(read,), name="nvrx-slo-stop-signals", daemon=True).start()

    def _run(self, read: int) -> None:
        while data := os.read(read, 64):
            for number in data:
                if number in self.STOPS and number not in self._seen:
                    self._seen.add(number)
                    self.journal.emit(EventType.LAUNCHER_SIGNAL, signal=number)


def _how_it_ended(status: int) -> dict[str, int]:
    """A wait status as the journal's fields: the signal that ended the process, or its exit code."""
    if status < 0:
        return {}
    return {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"exit_code": os.WEXITSTATUS(status)}


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


# NVRx 0.5's launcher sets up NVIDIA's own training telemetry (nv_one_logger) as it loads and, with
# no exporter asked for (NVRX_TELEMETRY_EXPORTER), warns on stderr that it will collect nothing:
# about NVRx's telemetry, not this job, on every start. That one message only.
_TELEMETRY_LOGGER = "nv_one_logger.training_telemetry.api.training_telemetry_provider"


def _not_the_no_exporter_warning(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("No exporters were provided")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.getLogger(_TELEMETRY_LOGGER).addFilter(_not_the_no_exporter_warning)
    launcher = nvrx_compat.launcher()
    if launcher is None:
        print("nvrx-slo ft-launcher: nvidia-resiliency-ext is not installed", file=sys.stderr)
        return 2
    journal = open_journal(launcher=True)
    try:
        exits: Callable[[], None] = WorkerExits(journal).watch
    except OSError:  # no timer process: worker exits go unjournaled (each dated at its last record)
        journal.errors += 1
        exits = lambda: None  # noqa: E731
    target = LauncherJournal(journal, exits)
    install(target)
    try:
        StopSignals(journal)
    except (OSError, ValueError):  # no pipe, or not the main thread: stops go unjournaled (each cause unknown)
        journal.errors += 1
    # dated when the container's process started, not after the imports above (seconds under load)
    started = process_start_mono()
    journal.emit_first(EventType.LAUNCHER_START, started if started is not None else time.monotonic(),
                       **_launch_counts(launcher, argv))
    code = 1
    os.environ[launch_env.OUR_LAUNCHER] = "1"  # its workers: their start is the launcher's worker_start
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
