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
from nvrx_slo.exporter.events import Event, self_consistent

ENDS = frozenset((EventType.PROCESS_END, EventType.LAUNCHER_EXIT, EventType.LAUNCHER_WORKER_EXIT))  # a process ended
_EPS = 1e-6  # float noise allowed where one instant must not lie past another


@dataclass(slots=True)
class Lives:
    """Per process (pid): when it began and when it ended."""

    # its start: its first record's (seq 0), else its earliest
    first: dict[int, float] = field(default_factory=dict)
    started: set[int] = field(default_factory=set)  # whose first record (seq 0) was read: their start is known
    ended: dict[int, float] = field(default_factory=dict)  # the instant it ended (its records end there)

    def plausible(self, record: Event, mono: float, begin: float, window: float, not_after: float) -> bool:
        """Whether the record may be accounted (``begin``: ``events.begin(record)``); changes nothing."""
        if mono > not_after or not self_consistent(record, begin):
            return False
        first = self.first.get(record.pid)
        if first is not None and begin < first - window:
            return False
        end = self.ended.get(record.pid)
        return end is None or mono <= end + _EPS

    def lived(self, record: Event, begin: float) -> None:
        """What an accepted record says of its process's life: when it began, and when it ended (its
        own end, or its launcher's word that it exited). Its caller skips it for the other records
        of a process whose start is known: they say nothing of its life."""
        pid = record.pid
        first = self.first.get(pid)
        if record.seq == 0:  # dated at the process's start: no later record walks it back a window at a time
            self.first[pid] = begin if pid not in self.started else min(first or begin, begin)
            self.started.add(pid)
        elif first is None or begin < first and pid not in self.started:
            self.first[pid] = begin
        if record.type in ENDS:
            ended = record.worker_pid if isinstance(record, LauncherWorkerExit) else pid
            self.ended[ended] = min(record.mono, self.ended.get(ended, float("inf")))
