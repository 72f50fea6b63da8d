"""Each process's life as its accepted records tell it, and the records that contradict it.

One schema-valid record with an absurd time would move every rank's wall for good (a ``mono``
8000 s early moves the origin; one in the future stretches a span), and negative durations would
take counters down. So the engine refuses (``Snapshot.implausible``) a record whose times
contradict themselves (``events.self_consistent``), contradict its process's life (a span
beginning more than the reorder window before the process's first record; any record dated after
the process ended, by its own ``process_end`` or ``launcher_exit`` or its launcher's
``launcher_worker_exit``: a flood of records claiming a finished process cannot stretch the job),
or lie in the future of the caller's clock. ``plausible`` only reads; ``lived`` is told only of
accepted records: a refused record changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nvrx_slo.contracts.schema import EventType, LauncherWorkerExit
from nvrx_slo.exporter.engine.dedupe import Seqs
from nvrx_slo.exporter.events import Event, self_consistent

ENDS = frozenset((EventType.PROCESS_END, EventType.LAUNCHER_EXIT, EventType.LAUNCHER_WORKER_EXIT))  # a process ended
_EPS = 1e-6  # float noise allowed where one instant must not lie past another


@dataclass(slots=True)
class Process:
    """One process (a pid) as its accepted records tell: when it began and ended, which of its
    records were read, and the lane they go to. One record, so that a journal record costs the
    engine one look-up of its process."""

    first: float | None = None  # its start: its first record's (seq 0), else its earliest
    started: bool = False  # its first record (seq 0) was read: its start is known
    ended: float | None = None  # the instant it ended: its records end there
    seqs: Seqs = field(default_factory=Seqs)  # which of its records were read (``dedupe``)
    lane: int | None = None  # the rank of the lane its records go to (``lanes``); None: none yet


def plausible(process: Process | None, record: Event, mono: float, begin: float, window: float,
              not_after: float) -> bool:
    """Whether the record of ``process`` (None: its first) may be accounted (``begin``:
    ``events.begin(record)``); changes nothing."""
    if mono > not_after or not self_consistent(record, begin):
        return False
    if process is None:
        return True
    first = process.first
    if first is not None and begin < first - window:
        return False
    end = process.ended
    return end is None or mono <= end + _EPS


def lived(processes: dict[int, Process], process: Process, record: Event, begin: float) -> None:
    """What an accepted record of ``process`` says of its life: when it began, and when it ended
    (its own end, or its launcher's word that a worker exited). Its caller skips it for the other
    records of a process whose start is known: they say nothing of its life."""
    first = process.first
    if record.seq == 0:  # dated at the process's start: no later record walks it back a window at a time
        process.first = begin if not process.started or first is None else min(first, begin)
        process.started = True
    elif first is None or begin < first and not process.started:
        process.first = begin
    if record.type in ENDS:
        ended = process
        if isinstance(record, LauncherWorkerExit):
            ended = processes.setdefault(record.worker_pid, Process())
        ended.ended = record.mono if ended.ended is None else min(ended.ended, record.mono)
