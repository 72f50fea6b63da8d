"""Lanes: one accelerator of the pod, paid for once. Which lane a record belongs to
(``ProcessLanes``), and what a lane holds (``Lane``): its ledger, its reorder buffer and the
counts that need no ordering.

A process's records go to the lane of the first rank it journaled. NVRx's ``inprocess.Wrapper``
renumbers the ranks above one it terminates (``ShiftRanks``), and a shifted process journals its
new rank: a rank that may be another pod's. Keyed by the record's own rank, the pod would count
that process twice (two lanes, two walls). Each process's file is read in order, so the first
rank seen of a pid is the one it started as.

A new process takes the lane of the accelerator it runs on, its ``local_rank``: after a
membership change torchelastic's rendezvous may hand a restarted worker another global rank (a
replacement pod joined first), and a pod of one accelerator still runs one lane. The engine and
the timeline both place records by this.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field
from functools import partial, reduce
from operator import add, attrgetter, sub
from typing import Annotated

import msgspec

from nvrx_slo.contracts.catalogue import STEP_BUCKETS, StepTimer
from nvrx_slo.contracts.schema import (
    CheckpointWorker,
    EventType,
    ProcessEnd,
    ProcessStart,
    Restore,
    Step,
    StepTimerKind,
    StepTiming,
)
from nvrx_slo.exporter.engine.accounting import Ledger
from nvrx_slo.exporter.engine.histogram import StepBuckets
from nvrx_slo.exporter.engine.restart_sink import RestartSink
from nvrx_slo.exporter.events import BEFORE_ALL, Event

RECENT_STEPS = 16  # step durations per rank for the skew ratio
ORDER = attrgetter("mono", "pid", "seq")  # the order records are applied in; unique per record
MONO, START, WALL = attrgetter("mono"), attrgetter("start"), attrgetter("wall")
_bucket = partial(bisect_left, STEP_BUCKETS)  # a step duration's histogram bucket


def new_lane(of_local: dict[int, int], rank: int, local_rank: int | None) -> int:
    """The lane of a process seen first journaling ``rank`` on ``local_rank``: its accelerator's
    (``of_local``: local rank -> the lane of that accelerator, which the first such process names)."""
    return rank if local_rank is None else of_local.setdefault(local_rank, rank)


@dataclass(slots=True)
class ProcessLanes:
    """pid -> the rank of the lane its records go to; local rank -> the lane of that accelerator."""

    of_pid: dict[int, int] = field(default_factory=dict)
    of_local: dict[int, int] = field(default_factory=dict)

    def of(self, pid: int, rank: int, local_rank: int | None) -> int:
        """The lane of a record of process ``pid`` that journaled ``rank`` on ``local_rank``."""
        lane = self.of_pid.get(pid)
        if lane is None:
            lane = self.of_pid[pid] = new_lane(self.of_local, rank, local_rank)
        return lane


@dataclass(slots=True)
class Counts:
    """What the engine counted of the records it was handed (``Snapshot``'s fields of these names)."""

    accepted: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    late: int = 0
    implausible: int = 0
    records_lost: int = 0


@dataclass(slots=True)
class Lane:
    """One rank: its ledger, its buffer of records not yet applied (sorted by ``ORDER``), and the
    per-rank counts that need no ordering."""

    ledger: Ledger
    pending: list[Event] = field(default_factory=list)
    applied: Event | None = None  # the last record applied
    newest: float = BEFORE_ALL  # mono of the newest record
    newest_pid: int = -1
    newest_kind: EventType | None = None
    newest_restart: int = 0
    newest_iter: int = 0
    steps: int = 0
    step: int | None = None  # of the newest step record
    step_mono: float = BEFORE_ALL
    step_wall: float | None = None
    hist: StepBuckets = field(default_factory=StepBuckets)
    # the newest RECENT_STEPS step durations: a ring, the newest at (steps - 1) % RECENT_STEPS
    recent: Annotated[list[float], msgspec.Meta(min_length=RECENT_STEPS, max_length=RECENT_STEPS)] = \
        field(default_factory=lambda: [0.0] * RECENT_STEPS)
    worker: bool | None = None
    worker_mono: float = BEFORE_ALL
    worker_pid: int = -1
    timer: StepTimer | None = None  # how its newest step_timing said steps are timed ...
    timer_mono: float = BEFORE_ALL
    timer_pid: int = -1  # ... and by which process
    local_world_size: int = 0  # the most workers its pod was said to run (0: not said)
    started: float = BEFORE_ALL  # mono of its newest process_start ...
    max_restarts: int | None = None  # ... and the restarts that process's launcher may make
    end_error: str | None = None  # the exception its newest record, a process_end, says it exited with
    last_restore_wall: float | None = None  # Unix time of its newest restore
    first_step_wall: float | None = None  # Unix time its first step began
    pids: dict[int, float] = field(default_factory=dict)  # pid -> its oldest record's mono

    def count(self, record: Event, mono: float) -> None:
        """The order-free per-rank counts."""
        if isinstance(record, Step):
            duration = mono - record.start
            self.recent[self.steps % RECENT_STEPS] = duration
            self.steps += 1
            hist = self.hist  # Buckets.observe, inlined: once per step
            hist.counts[bisect_left(STEP_BUCKETS, duration)] += 1
            hist.sum += duration
            hist.count += 1
            if mono > self.step_mono:
                self.step, self.step_mono, self.step_wall = record.step, mono, record.wall
            begun = record.wall - duration
            if self.first_step_wall is None or begun < self.first_step_wall:
                self.first_step_wall = begun
        elif isinstance(record, CheckpointWorker):
            if mono > self.worker_mono:
                self.worker, self.worker_mono, self.worker_pid = record.alive, mono, record.pid
        elif isinstance(record, StepTiming):
            if mono > self.timer_mono:
                self.timer_mono, self.timer_pid = mono, record.pid
                self.timer = (StepTimer.CUDA if record.timer == StepTimerKind.CUDA.value
                              else StepTimer.HOST_ON_GPU if record.cuda else StepTimer.HOST)
        elif isinstance(record, ProcessStart):
            self.local_world_size = max(self.local_world_size, record.local_world_size or 0)
            if mono > self.started:
                self.started, self.max_restarts = mono, record.max_restarts
        elif isinstance(record, Restore):
            if self.last_restore_wall is None or record.wall > self.last_restore_wall:
                self.last_restore_wall = record.wall
        pid = record.pid
        if pid != self.newest_pid or mono < self.newest:  # else: its first record is older already
            first = self.pids.get(pid)
            if first is None or mono < first:
                self.pids[pid] = mono
        if mono > self.newest:
            self.newest, self.newest_pid, self.newest_kind = mono, pid, record.type
            self.newest_restart, self.newest_iter = record.restart, record.iter
            self.end_error = record.error if isinstance(record, ProcessEnd) else None

    def take(self, ev: Event, window: float, sink: RestartSink, counts: Counts) -> None:
        """Buffer a record in order and apply to the ledger every buffered one that lies more than
        ``window`` before the newest. One older than a record already applied is ``late``: left out."""
        mono = ev.mono  # comparisons by mono first: ORDER's tuples are built only on a tie
        applied = self.applied
        if applied is not None and (mono < applied.mono or mono == applied.mono and ORDER(ev) < ORDER(applied)):
            counts.late += 1
            return
        pending = self.pending
        if pending:
            last = pending[-1]
            if mono < last.mono or mono == last.mono and ORDER(ev) < ORDER(last):
                insort(pending, ev, key=ORDER)
                counts.out_of_order += 1
                return
        pending.append(ev)
        horizon = mono - window
        if pending[0].mono >= horizon:
            return
        n = bisect_left(pending, horizon, key=MONO)
        if n == 1:  # the usual case: the record the window passed
            self.ledger.apply(pending[0], sink)
        else:
            self.ledger.apply_many(pending[:n], sink)
        self.applied = pending[n - 1]
        del pending[:n]

    def take_run(self, run: list[Event], steps: list[Step], window: float, sink: RestartSink) -> None:
        """``count`` and ``take`` each record of a run (``runs``: steps and saves' parts of its newest
        process, each no earlier than the one before and later than any record it holds; ``steps``:
        its steps, in order), as they would one by one: the histogram per step, the newest of
        everything once, the buffer extended once and applied to the ledger up to the last record's
        horizon (the union of each record's)."""
        if steps:
            self._count_steps(steps)
        last = run[-1]
        self.newest, self.newest_kind, self.end_error = last.mono, last.type, None
        self.newest_restart, self.newest_iter = last.restart, last.iter
        pending = self.pending
        pending += run
        applied = bisect_left(pending, last.mono - window, key=MONO)
        if applied:
            self.ledger.apply_many(pending[:applied], sink)
            self.applied = pending[applied - 1]
            del pending[:applied]

    def _count_steps(self, steps: list[Step]) -> None:
        """``count`` each of a run's steps (each later than the one before and than any it holds)."""
        durations = list(map(sub, map(MONO, steps), map(START, steps)))
        hist, n = self.hist, len(steps)
        counts = hist.counts
        low = _bucket(min(durations))
        if low == _bucket(max(durations)):  # nearly always: steps of one length
            counts[low] += n
        else:
            for bucket in map(_bucket, durations):
                counts[bucket] += 1
        hist.sum = reduce(add, durations, hist.sum)  # each in turn, as ``count`` adds them
        hist.count += n
        begun = min(map(sub, map(WALL, steps), durations))
        if self.first_step_wall is None or begun < self.first_step_wall:
            self.first_step_wall = begun
        kept = min(n, RECENT_STEPS)  # the newest, into the ring from where the step before them went
        at = (self.steps + n - kept) % RECENT_STEPS
        wrap = max(0, at + kept - RECENT_STEPS)
        self.recent[at:at + kept - wrap] = durations[n - kept:n - wrap]
        self.recent[:wrap] = durations[n - wrap:]
        self.steps += n
        last = steps[-1]
        self.step, self.step_mono, self.step_wall = last.step, last.mono, last.wall

    def settle(self, sink: RestartSink) -> None:
        """Apply every buffered record to the ledger now (``Engine.settle``)."""
        if self.pending:
            self.ledger.apply_many(self.pending, sink)
            self.applied = self.pending[-1]
            self.pending.clear()

    def recent_mean(self) -> float | None:
        """The mean duration of its newest RECENT_STEPS steps (None: no step yet)."""
        n = min(self.steps, RECENT_STEPS)
        return sum(self.recent) / n if n else None

    def first(self) -> float:
        return min(self.pids.values())

    def pid_at(self, mono: float) -> int | None:
        """The process this rank ran at ``mono`` (the newest one started by then), None if none yet."""
        started = [(first, pid) for pid, first in self.pids.items() if first <= mono]
        return max(started)[1] if started else None

    def step_timer(self) -> StepTimer | None:
        """How the newest process times its steps (None: it has not said)."""
        return self.timer if self.timer_pid == self.newest_pid else None

    def worker_alive(self) -> bool | None:
        """The newest process's async checkpoint worker, as it last reported (None: not yet)."""
        return self.worker if self.worker_pid == self.newest_pid else None
