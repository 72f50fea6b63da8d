"""The time-accounting engine: journal events in, a ``Snapshot`` out. Pure: no I/O, no threads,
no globals, no clock reads — the caller passes the clock to ``snapshot``.

Usage (one engine per pod journal)::

    engine = Engine()
    for event in events:                      # nvrx_slo.exporter.events' structs, any order
        engine.ingest(event)
    snap = engine.snapshot(time.monotonic(), time.time())
    state = engine.to_state()                 # JSON-safe; persist it with the reader's offsets
    engine = Engine.from_state(state)         # resume after a crash: nothing lost or counted twice

Views that draw more than a snapshot holds (the offline report's timeline) make the engine with
``keep_history=True`` and read what it decided — ``take_decisions()`` (each step's productive/lost
verdict, each wait on saves it booked) and ``history()`` (every restart and save) — rather than
deciding it again.

Arrival order: records may arrive in any order within ``reorder_window_s`` of monotonic time per
rank (files read round-robin, threads writing slightly out of order); they are accounted exactly
as if they had arrived sorted. A record older than one the rank has already applied (one more
than the window behind its newest) is counted in ``Snapshot.late`` and left out of the rank's
time accounting, because the time it would change is settled in counters that never go down. A reader that
catches up on a backlog must therefore feed each rank's files oldest first (merging by ``mono``
is best). Duplicates by (pid, seq, mono) are counted and ignored (``dedupe``). See docs/accounting.md
for the model.

Plausibility: ``ingest`` counts and drops (``Snapshot.implausible``) a record whose times
contradict themselves, its process's life or the caller's clock (``not_after``: ``Live`` passes
its monotonic clock plus a slack); see ``life``. A refused record, like a duplicate, changes
nothing but its count: every check reads state, and only an accepted record writes it.

How: each rank keeps its not-yet-applied records sorted in a buffer; a record is applied to the
rank's ``Ledger`` once the rank's newest record is ``reorder_window_s`` past it (``lanes.Lane``), and only applied
records settle time, so settled seconds never go down whatever the arrival order. The rank's
time after its last applied record is provisional (``unprotected_s``) — the settled numbers lag
the journal by the window. Counts that need no ordering (steps, the step histogram, the latest
step, worker liveness, checkpoint aggregates) are taken at ingest, without lag.

The end: a job is over when no process of it can run again (``Launcher.ending``: our launcher
exited, or, launched any other way, every rank's newest process journaled its end), finished or
failed. Nothing is held back then: the first snapshot (or ``history``, ``take_decisions``) after
it *settles* — applies every buffer for good, folds every restart and save that is done, and
closes each rank's ledger at the job's end — so its numbers are final and stay put. Settled is
settled: if the job runs again after all (a new process: a pod restarted, a round torchrun started
again), it goes on from there, and a record older than what was settled is ``late``. ``settle``
does the same for a reader that will read no more (the sidecar when its pod ends, the report),
without closing the ledgers of a job that is not over.

The clock: ``snapshot(now_mono, …)`` counts a running job's wall up to ``now_mono``, a finished
job's up to its last record. A finish read after a snapshot that showed the job running at a
later instant (the reader lagged) would take wall back, so the engine remembers the furthest
instant it has shown and never ends wall before it. Callers keep that rare by passing a *read
horizon* as ``now_mono`` — an instant before which every record has been ingested (``Live``
passes the start of its last complete journal poll) — so the finish lies after it.

The state: everything the engine holds is one ``EngineState`` of msgspec structs, saved and
loaded by msgspec (``to_state``, ``from_state``) under ``STATE_VERSION``; a state of another
version is refused, and the sidecar then accounts the journal again from its start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec

from nvrx_slo.contracts.catalogue import Category, FaultCause
from nvrx_slo.contracts.schema import CheckpointPart, EventType, LauncherSignal, LauncherWorkerExit, ProcessStart
from nvrx_slo.exporter import events
from nvrx_slo.exporter.engine import assembly, derived, runs
from nvrx_slo.exporter.engine.accounting import Ledger
from nvrx_slo.exporter.engine.causes import CAUSES
from nvrx_slo.exporter.engine.checkpoints import Checkpoints
from nvrx_slo.exporter.engine.lanes import Counts, Lane, new_lane
from nvrx_slo.exporter.engine.launcher import Ending, Launcher
from nvrx_slo.exporter.engine.life import ENDS, Process, lived, plausible
from nvrx_slo.exporter.engine.restart_sink import Credit
from nvrx_slo.exporter.engine.restarts import Restarts
from nvrx_slo.exporter.engine.snapshot import CheckpointRecord, RestartRecord, Snapshot
from nvrx_slo.exporter.events import BEFORE_ALL, STRUCTS, Event

__all__ = ["Engine", "IngestFailed", "Snapshot", "REORDER_WINDOW_S"]

REORDER_WINDOW_S = 10.0
STATE_VERSION = 16
FOLD_EVERY_S = 1.0  # finished restarts move into the histograms when one ends, and this often (journal time)
# the records that can make a rank's work productive, by struct class (a set of classes is read fastest)
_DECIDING = frozenset(STRUCTS[kind] for kind in (EventType.CHECKPOINT_END, EventType.RESTORE))


@dataclass(slots=True, kw_only=True)
class EngineState:
    """Everything an engine holds, as it is saved (``Engine.to_state``)."""

    version: int = STATE_VERSION
    window: float
    keep_history: bool = False
    lanes: dict[int, Lane] = field(default_factory=dict)  # by rank
    lane_of_local: dict[int, int] = field(default_factory=dict)  # local rank -> the lane of that accelerator
    processes: dict[int, Process] = field(default_factory=dict)  # by pid
    restarts: Restarts
    checkpoints: Checkpoints
    launcher: Launcher = field(default_factory=Launcher)
    counts: Counts = field(default_factory=Counts)
    origin: float | None = None  # the pod's first instant (mono) ...
    origin_wall: float | None = None  # ... and on the wall clock
    newest: float = BEFORE_ALL  # mono of the newest record
    world_size: int | None = None  # the most ranks a process was started among
    identity: tuple[str, str, str] = ("", "", "")  # job, pod, node
    next_fold: float = BEFORE_ALL
    shown: float = BEFORE_ALL  # the furthest instant a snapshot counted wall to


class IngestFailed(Exception):
    """Accounting ``records[start:end]`` raised (``Engine.ingest_many``; the cause is chained): one
    record, or a run of plain records. The records before them were accounted, those after were not."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__(f"accounting records {start}..{end - 1} raised")
        self.start, self.end = start, end


@dataclass(frozen=True)
class History:
    """Every restart and save the engine folded or still holds open, oldest first (``keep_history``)."""

    restarts: tuple[RestartRecord, ...]
    checkpoints: tuple[CheckpointRecord, ...]


# A step verdict: the steps of one rank that ended (mono) in [first, last] and were undecided
# until then are productive (True) or lost (False). See ``Ledger.verdicts``.
Verdict = tuple[float, float, bool]


class Decisions(NamedTuple):
    """One rank's decisions since the last ``take_decisions``: step verdicts, and the stretches
    (start, end mono) booked as checkpoint blocking from records' ``blocked_s``."""

    verdicts: list[Verdict]
    waits: list[tuple[float, float]]


class Engine:
    """Accounts one pod's journal. ``ingest`` costs a few µs per step event."""

    def __init__(self, reorder_window_s: float = REORDER_WINDOW_S, *, keep_history: bool = False) -> None:
        if reorder_window_s < 0:
            raise ValueError(f"reorder_window_s must be >= 0, got {reorder_window_s}")
        self._s = EngineState(
            window=reorder_window_s, keep_history=keep_history,
            restarts=Restarts(None) if keep_history else Restarts(),
            checkpoints=Checkpoints(reorder_window_s, None) if keep_history else Checkpoints(reorder_window_s))

    @property
    def window(self) -> float:
        return self._s.window

    @property
    def keep_history(self) -> bool:
        return self._s.keep_history

    # --- ingest --------------------------------------------------------------------------------
    def ingest(self, record: Event, not_after: float = float("inf")) -> bool:
        """Account one journal event (``nvrx_slo.exporter.events``); ``not_after``: the latest
        ``mono`` that is not in the future of the caller's clock (see Plausibility above). Returns
        whether it was accepted: a record refused (implausible, a duplicate) changed nothing but
        its count."""
        s = self._s
        process = self._admit(record, not_after)
        if process is None:
            return False
        rank: int | None = record.rank
        if rank is not None:
            lane_rank = process.lane
            rank = process.lane = new_lane(s.lane_of_local, rank, record.local_rank) if lane_rank is None else lane_rank
        mono, begin = record.mono, events.begin(record)
        if s.origin is None or begin < s.origin:
            s.origin, s.origin_wall = begin, record.wall - (mono - begin)
            if not s.identity[1]:
                s.identity = (record.job, record.pod, record.node)
        if mono > s.newest:
            s.newest = mono
        s.counts.accepted += 1
        lane = None if rank is None else self._count(rank, record, mono)
        if s.newest >= s.checkpoints.due:  # before adding: a new save never joins one that is over
            self._fold_checkpoints()
        if lane is None:
            self._launcher(record, mono)
        else:
            if isinstance(record, CheckpointPart):
                if s.checkpoints.add(record, record.ckpt, lane.ledger.rank):
                    self._fold_checkpoints()  # a part found its start: the save it had joined may be over
            elif isinstance(record, ProcessStart) and record.world_size > (s.world_size or 0):
                s.world_size = record.world_size
            lane.take(record, s.window, s.restarts, s.counts)
        if s.restarts.open and (s.newest >= s.next_fold or s.restarts.ended_since_fold):
            self._fold_restarts()
        return True

    def ingest_many(self, records: Sequence[Event], not_after: float = float("inf")) -> list[Event]:
        """``ingest`` each record in order; returns those accepted. Runs of plain steps and saves'
        parts (``runs``: the bulk of a journal) are accounted a run at a time, exactly as one by one.
        If accounting raises (an engine bug), ``IngestFailed`` says which records it was accounting; those
        before them were accounted, those after were not."""
        accepted: list[Event] = []
        i, n = 0, len(records)
        while i < n:
            found = runs.scan(self._s, records, i, not_after)
            end = found.end
            try:
                if end > i:
                    runs.account(self._s, records, i, found, self._fold_checkpoints)
                    accepted += records[i:end]
                else:
                    end = i + 1
                    if self.ingest(records[i], not_after):
                        accepted.append(records[i])
            except Exception as exc:
                raise IngestFailed(i, end) from exc
            i = end
        return accepted

    def _admit(self, record: Event, not_after: float) -> Process | None:
        """The record's process, if the record is plausible and not a duplicate (else it is counted
        as such and None returned); what it says of its process's life is noted."""
        s = self._s
        pid, seq, mono = record.pid, record.seq, record.mono
        begin = events.begin(record)
        process = s.processes.get(pid)
        if not plausible(process, record, mono, begin, s.window, not_after):
            s.counts.implausible += 1
            return None
        if process is None:
            process = s.processes[pid] = Process()
        seqs = process.seqs
        if seq == seqs.floor and not seqs.ahead:
            seqs.floor = seq + 1  # the common case: the next record of a file read in order
        else:
            duplicate, lost = seqs.seen(seq, mono, s.window)
            s.counts.records_lost += lost
            if duplicate:
                s.counts.duplicates += 1
                return None
        if not process.started or record.type in ENDS:  # a started process's other records say nothing of its life
            lived(s.processes, process, record, begin)
        return process

    def _count(self, rank: int, record: Event, mono: float) -> Lane:
        """The lane of ``rank``, with ``record`` counted in it."""
        s = self._s
        lane = s.lanes.get(rank)
        if lane is None:
            kept = s.keep_history
            lane = s.lanes[rank] = Lane(Ledger(rank, verdicts=[] if kept else None, waits=[] if kept else None))
        newest_pid = lane.newest_pid
        lane.count(record, mono)
        if lane.newest_pid != newest_pid:
            s.checkpoints.rearm(s.newest)
        return lane

    def _launcher(self, record: Event, mono: float) -> None:
        """A record of no rank: the launcher's."""
        s = self._s
        s.restarts.launcher_event(record.type, mono)
        s.launcher.note(record)
        if isinstance(record, LauncherSignal):
            s.restarts.stop(mono, record.signal)
        if isinstance(record, LauncherWorkerExit) and not s.restarts.tearing_down(mono):
            # a worker died on its own: the fault's instant, for its rank's ledger
            exited = next((ln for ln in s.lanes.values() if record.worker_pid in ln.pids), None)
            if exited is not None:
                exited.take(record, s.window, s.restarts, s.counts)

    def _fold_restarts(self) -> None:
        s = self._s
        lanes = s.lanes
        applied = {r: float("-inf") if ln.applied is None else ln.applied.mono for r, ln in lanes.items()}
        self._credit(s.restarts.fold(s.newest, s.window, applied, {r: ln.first() for r, ln in lanes.items()}))
        s.next_fold = s.newest + FOLD_EVERY_S

    def _credit(self, credits: list[Credit]) -> None:
        """What folded restarts decided of their ranks' held seconds, to the ranks' ledgers."""
        for rank, lost, restart, failed in credits:
            self._s.lanes[rank].ledger.decided(lost, restart, failed)

    def _fold_checkpoints(self) -> None:
        lanes = self._s.lanes
        self._s.checkpoints.fold(self._s.newest, self._live(), lambda r, at: lanes[r].pid_at(at))

    def _live(self) -> dict[int, int]:
        return {rank: lane.newest_pid for rank, lane in self._s.lanes.items()}

    def _ending(self) -> Ending | None:
        """How the job ended (None: it runs), settled first (see the module docstring)."""
        s = self._s
        ending = s.launcher.ending(s.lanes, s.restarts.workers_started())
        if ending is not None and s.lanes:
            self.settle()
            self._credit(s.restarts.release())
            end = max(s.newest, s.shown)
            for lane in s.lanes.values():
                lane.ledger.close(end)
        return ending

    def settle(self) -> None:
        """Nothing more is coming (the reader's last read, or the job is over): apply every rank's
        reorder buffer for good, and fold every restart and save whose ranks are done. A record read
        later than one applied here is ``late``."""
        s = self._s
        for lane in s.lanes.values():
            lane.settle(s.restarts)
        self._credit(s.restarts.settle())
        s.checkpoints.settle(self._live())

    # --- snapshot ------------------------------------------------------------------------------
    def snapshot(self, now_mono: float, now_wall: float) -> Snapshot:
        """Everything known at ``now_mono`` (the journal's monotonic clock, ideally a read horizon: see
        the module docstring). Changes nothing but the furthest instant shown, so wall never goes
        back, and what settling a job that is over changes."""
        s = self._s
        ending = self._ending()
        finished = ending is not None
        restarts = s.restarts
        ledgers = {rank: s.lanes[rank].ledger for rank in sorted(s.lanes)}
        # every record read, applied on copies: what the reorder window has yet to settle as productive
        previews = ledgers if finished else self._previews()
        origin = s.origin if s.origin is not None else now_mono
        end = max(s.newest, s.shown) if finished else max(now_mono, s.newest, s.shown)
        if s.lanes:
            s.shown = end
        skew = derived.skew_ratios({r: mean for r, lane in s.lanes.items() if (mean := lane.recent_mean()) is not None})
        ranks = tuple(assembly.rank(ledgers[r], previews[r], s.lanes[r], origin, end, finished, skew.get(r),
                                    restarts.held(r)) for r in ledgers)
        mtbf = derived.mtbf(end - origin, restarts.faults())
        ck = s.checkpoints.view(self._live())
        job, pod, node = s.identity
        counts = s.counts
        return Snapshot(
            now_mono=now_mono, now_wall=now_wall, job=job, pod=pod, node=node, job_start_wall=s.origin_wall,
            finished=finished, failure=None if ending is None else ending.failure, ranks=ranks,
            checkpoints=assembly.checkpoint_stats(ck, ranks, now_mono, mtbf),
            restarts=restarts.stats(mtbf, s.launcher.remaining(s.lanes)),
            predicted_efficiency=derived.ettr(assembly.interval(ck), assembly.blocking_cost(ck),
                                              restarts.mean_duration(), mtbf),
            events_accepted=counts.accepted, duplicates=counts.duplicates, out_of_order=counts.out_of_order,
            late=counts.late, implausible=counts.implausible, records_lost=counts.records_lost,
            journal_lag_s=None if s.origin is None else max(0.0, now_mono - s.newest),
            world_size=s.world_size or s.launcher.world, pod_ranks=s.launcher.pod_ranks(s.lanes, finished),
            absent_s=0.0, caused=_caused(restarts, ledgers.values(), finished))

    def _previews(self) -> dict[int, Ledger]:
        """The ledgers by rank, each with its reorder buffer applied on a copy where the buffer holds
        a record that decides work (a save's end, a restore): what the saves read so far keep."""
        restarts = self._s.restarts.copy()
        ledgers: dict[int, Ledger] = {}
        for rank in sorted(self._s.lanes):
            lane = self._s.lanes[rank]
            ledger = lane.ledger
            if lane.pending and not _DECIDING.isdisjoint(map(type, lane.pending)):
                ledger = ledger.copy()
                for r in lane.pending:
                    ledger.apply(r, restarts)
            ledgers[rank] = ledger
        return ledgers

    def take_decisions(self) -> dict[int, Decisions]:
        """What was decided since the last call, by rank (``keep_history`` only)."""
        if not self.keep_history:
            raise RuntimeError("take_decisions needs Engine(keep_history=True)")
        self._ending()
        out: dict[int, Decisions] = {}
        for rank in sorted(self._s.lanes):
            own = self._s.lanes[rank].ledger
            out[rank] = Decisions(own.verdicts or [], own.waits or [])
            own.verdicts, own.waits = [], []
        return out

    def history(self) -> History:
        """Every restart and save so far (``keep_history`` only)."""
        if not self.keep_history:
            raise RuntimeError("history needs Engine(keep_history=True)")
        self._ending()
        return History(tuple(self._s.restarts.records()), self._s.checkpoints.view(self._live()).records)

    # --- state ---------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """A JSON-safe copy of the engine's state (strict JSON: every number finite)."""
        state: dict[str, Any] = msgspec.to_builtins(self._s, str_keys=True)
        return state

    @classmethod
    def from_state(cls, state: Any) -> Engine:
        """The engine ``to_state`` saved; raises ``ValueError`` if the state is not one."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not an engine state of version {STATE_VERSION}")
        try:
            loaded = msgspec.convert(state, EngineState, str_keys=True)
        except (msgspec.ValidationError, ValueError, TypeError) as exc:
            raise ValueError(f"not an engine state: {exc}") from None
        engine = cls.__new__(cls)
        engine._s = loaded
        return engine


def _caused(restarts: Restarts, ledgers: Iterable[Ledger], finished: bool) -> dict[tuple[Category, FaultCause], float]:
    """The lost and restart seconds by cause: each rank's own (its unfinished steps) and the restarts'."""
    ledgers = list(ledgers)
    lost, restart = restarts.caused(finished, [(led.fact, led.fact_restart) for led in ledgers if led.fact is not None])
    for led in ledgers:
        lost = [a + b for a, b in zip(lost, led.lost_by, strict=True)]
    out = {}
    for category, by in ((Category.LOST, lost), (Category.RESTART, restart)):
        out.update({(category, cause): seconds for cause, seconds in zip(CAUSES, by, strict=True) if seconds > 0})
    return out
