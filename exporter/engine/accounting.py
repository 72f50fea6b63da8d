"""One rank's time accounting: its events, applied in monotonic order, partition its clock.

A ``Ledger`` has accounted the rank's time up to ``t``. Each event moves ``t`` forward: the gap
since ``t`` goes to the category the loop's *state* implies (init, checkpoint_blocking, restart,
unattributed, shutdown), then a span (step, restore, finalize) takes its own stretch; a record's
``blocked_s`` (the loop's waits on saves since the previous record) is booked as checkpoint
blocking from the stretch before it (a step's, from its span too). Point events other threads
write mid-step (worker liveness, checkpoint_end, warnings) never move ``t``; spans overlapping
time already accounted are clipped: each second is counted once.

Work (a step minus its ``data_s``) waits in the *pool* (unprotected) until the first later
decisive event: a checkpoint_end ok or a restore at a step ≥ its own makes it productive (final);
a restore from an older step (or a fresh start) makes it lost. A ledger made with ``verdicts=[]``
and ``waits=[]`` also lists each decision and each stretch booked from ``blocked_s``, so that
views (the report's timeline) draw what was decided here instead of deciding again.

Restarts: a new pid for the rank is an in-job restart (``restart`` count went up) or a pod
restart (it did not: a new launcher counts from 0 again); Wrapper callbacks or a higher ``iter``
in the same pid are an in-process restart. The rank stays in state RESTART until the first step
of the restarted loop starts; each restart goes to a ``RestartSink`` under a key all ranks share.
What a rank would book lost in a fault's wake (its ``unfinished`` step, the work its restore rolls
back) the restart holds until its fault instant is known, then hands back split (``decided``):
lost before the instant, restart after (docs/accounting.md, "The fault's wake"). Causes: the lost
part of an unfinished step is its own fault's; the rest a restart decides or the rank books in it
(``fact_restart``) is the restart's; lost work with neither is ``unknown`` (``lost_by``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce
from operator import add
from typing import Annotated, cast

import msgspec

from nvrx_slo.contracts.catalogue import SETTLED_CATEGORIES, Category, FaultCause, RestartLevel, RestartPhase
from nvrx_slo.contracts.schema import (
    Blocked,
    Cause,
    CheckpointEnd,
    CheckpointFinalize,
    CheckpointScheduled,
    CheckpointStart,
    EventType,
    FaultInjected,
    InprocessAbort,
    InprocessCompletion,
    InprocessFinalize,
    InprocessRankAssignment,
    LauncherWorkerExit,
    ProcessEnd,
    ProcessStart,
    Restore,
    Step,
    StepFailed,
    UserSpan,
)
from nvrx_slo.exporter.engine import causes
from nvrx_slo.exporter.engine.causes import CAUSES
from nvrx_slo.exporter.engine.pool import POOL_MAX, Pool
from nvrx_slo.exporter.engine.restart_sink import Held, RestartSink
from nvrx_slo.exporter.engine.snapshot import RankState
from nvrx_slo.exporter.events import STRUCTS, Event, begin

IDX = {c: i for i, c in enumerate(SETTLED_CATEGORIES)}
PRODUCTIVE, LOST, BLOCKING = IDX[Category.PRODUCTIVE], IDX[Category.LOST], IDX[Category.CHECKPOINT_BLOCKING]
RESTORE, RESTART, INIT = IDX[Category.CHECKPOINT_RESTORE], IDX[Category.RESTART], IDX[Category.INIT]
DATA, UNATTRIBUTED, SHUTDOWN = IDX[Category.DATA_WAIT], IDX[Category.UNATTRIBUTED], IDX[Category.SHUTDOWN]
USER = IDX[Category.USER_SPAN]
USER_NAMES = 16  # distinct user span names kept per rank; later ones are summed as OTHER_NAME
OTHER_NAME = "other"
GAP = {RankState.INIT: INIT, RankState.TRAINING: UNATTRIBUTED, RankState.RESTART: RESTART,
        RankState.ENDED: SHUTDOWN}
_UNKNOWN = causes.INDEX[FaultCause.UNKNOWN]
_STEP = cast("type[Step]", STRUCTS[EventType.STEP])  # a step's struct: ``type(ev) is`` it is the fastest test
INPROCESS_FAULT = (InprocessAbort, InprocessFinalize, InprocessRankAssignment)  # the Wrapper's: a fault
# the Wrapper's callbacks: the restart phase each one ends
_MARKS = {EventType.INPROCESS_ABORT: RestartPhase.DETECT, EventType.INPROCESS_FINALIZE: RestartPhase.TEARDOWN,
          EventType.INPROCESS_RANK_ASSIGNMENT: RestartPhase.RENDEZVOUS,
          EventType.INPROCESS_INITIALIZE: RestartPhase.REINIT}


# Over 450 lines on purpose: one class whose event handlers share the ledger's private state.
@dataclass(slots=True)
class Ledger:
    """The accounted state of one rank. ``apply`` events in (mono, pid, seq) order.

    A struct so that its saved state is typed: loading one checks every field, and a state file
    edited by hand or by another version fails there instead of in a later scrape."""

    rank: int
    first: float | None = None  # start of the rank's first event
    t: float = 0.0  # accounted up to here (mono)
    state: RankState = RankState.INIT
    blocking: str | None = None  # ckpt id of the save blocking the loop now
    fault: float | None = None  # journaled fault instant in the current loop (see _died)
    fault_wall: float = 0.0
    cause: str | None = None
    why: FaultCause | None = None  # the cause of the rank's own fault in its current loop
    pid: int = -1
    restart: int = 0
    iter: int = 0
    gen: int = 0  # pod restarts seen
    launch: str = "0"  # which start of the launcher made this process (keys its in-process restarts)
    inproc: int = 0  # in-process restarts in this pid
    fact: str | None = None  # key of the open restart
    fact_inprocess: bool = False
    fact_reinit: bool = False  # the open in-process restart has re-initialised
    fact_restart: float = 0.0  # seconds booked restart while the open restart lasts: charged to it
    unfinished: Held | None = None  # the step its fault left, until a restart takes it (see the module docstring)
    seconds: Annotated[list[float], msgspec.Meta(min_length=len(SETTLED_CATEGORIES),
                                                 max_length=len(SETTLED_CATEGORIES))] = \
        field(default_factory=lambda: [0.0] * len(SETTLED_CATEGORIES))
    pool: Pool = field(default_factory=Pool)  # its undecided work
    last_wall: float = 0.0
    # (first, last, productive) per decided pool entry, in decision order: the steps of this
    # rank that ended in [first, last] (mono) and were undecided until then. None: not kept.
    verdicts: list[tuple[float, float, bool]] | None = None
    # (start, end) mono of each stretch booked from a record's ``blocked_s`` (the loop's waits on
    # saves), in booking order, kept with the verdicts for the same views. None: not kept.
    waits: list[tuple[float, float]] | None = None
    user: dict[str, float] = field(default_factory=dict)  # user_span seconds by name (USER_NAMES, OTHER_NAME)
    # lost seconds charged to a cause here, not by a restart (by ``causes.INDEX``): work no restart took
    lost_by: Annotated[list[float], msgspec.Meta(min_length=len(CAUSES), max_length=len(CAUSES))] = \
        field(default_factory=causes.zeros)

    # --- time ------------------------------------------------------------------------------
    def _advance(self, to: float) -> None:
        if to > self.t:
            idx = BLOCKING if self.blocking is not None else GAP[self.state]
            self.seconds[idx] += to - self.t
            if idx == RESTART:  # the state is RESTART only while a restart is open
                self.fact_restart += to - self.t
            self.t = to

    def close(self, end: float) -> None:
        """The job is over at ``end``: account the rank's time up to it (the loop's state says as what)."""
        if self.first is not None:
            self._lose_unfinished()
            self._advance(end)

    def undecided(self) -> float:
        """Seconds it accounted but has not decided (part of its unprotected time): its work since the
        last save, and its unfinished step until a restart takes it."""
        return self.pool.sum + (0.0 if self.unfinished is None else self.unfinished.seconds)

    def decided(self, lost: float, restart: float, failed: tuple[float, ...]) -> None:
        """A restart split what this rank held (``Restarts.fold``): ``lost`` and ``restart`` seconds,
        and where its unfinished steps that lost work ended."""
        self.seconds[LOST] += lost
        self.seconds[RESTART] += restart
        if self.verdicts is not None:
            self.verdicts += [(end, end, False) for end in failed]

    def _span(self, start: float, end: float, idx: int) -> float:
        """Book [start, end] to ``idx`` (what the ledger had not accounted yet); returns the seconds booked."""
        self._advance(start)
        if end <= self.t:
            return 0.0
        booked = end - self.t
        self.seconds[idx] += booked
        self.t = end
        return booked

    def _blocked(self, begin: float, seconds: float) -> None:
        """The last ``seconds`` of the stretch before ``begin`` (at most all of it) were the loop
        waiting on saves (a record's ``blocked_s``): book them as checkpoint blocking."""
        self._advance(max(self.t, begin - seconds))
        if self.waits is not None and begin > self.t:
            self.waits.append((self.t, begin))
        self._span(self.t, begin, BLOCKING)

    # --- durability --------------------------------------------------------------------------
    def _decide(self, keep_upto: int | None, drop_rest: bool, sink: RestartSink) -> None:
        """Steps ≤ ``keep_upto`` become productive; the rest become lost if ``drop_rest`` (held by
        the open restart, which decides what of them was its own)."""
        kept, lost, verdicts = self.pool.take(keep_upto, drop_rest)
        seconds = self.seconds
        # reduce(add, ws, x) adds each in turn, as `x += w` entry by entry does: the same sums to the bit
        seconds[PRODUCTIVE] = reduce(add, kept, seconds[PRODUCTIVE])
        if lost:
            ends = [last for _, last, productive in verdicts if not productive]
            self._hold([Held(end, work, None) for end, work in zip(ends, lost, strict=True)], sink)
        if self.verdicts is not None:
            self.verdicts += verdicts

    def _hold(self, held: list[Held], sink: RestartSink | None) -> None:
        """Lost work, for the open restart to split at its fault instant (a folded one splits it at
        once); lost at once when no restart takes it (charged to its own fault's cause, else ``unknown``)."""
        if sink is not None and self.fact is not None:
            if sink.hold(self.rank, self.fact, held):
                return
            if (credit := sink.split_late(self.rank, self.fact, held)) is not None:
                self.decided(credit.lost, credit.restart, credit.failed)
                return
        for end, seconds, cause in held:
            self.seconds[LOST] += seconds
            self.lost_by[_UNKNOWN if cause is None else causes.INDEX[cause]] += seconds
            if cause is not None and self.verdicts is not None:
                self.verdicts.append((end, end, False))

    def _lose_unfinished(self) -> None:
        """No restart took the rank's unfinished step (the loop went on, or the job is over): lost."""
        if self.unfinished is not None:
            self._hold([self.unfinished], None)
            self.unfinished = None

    # --- restarts ----------------------------------------------------------------------------
    def _begin(self, key: str, level: RestartLevel, sink: RestartSink, inprocess: bool) -> None:
        injected = self.fault is not None
        fault = self.fault if self.fault is not None else self.t
        fault_wall = self.fault_wall if self.fault is not None else self.last_wall
        if self.fact is not None:  # the previous restart failed before its first step
            self._end_fact(fault, sink)
        sink.began(self.rank, key, level, fault, fault_wall, injected, self.cause, self.why)
        self.fact, self.fact_inprocess, self.fact_reinit = key, inprocess, False
        self.state, self.blocking, self.fault, self.cause, self.why = RankState.RESTART, None, None, None, None
        if self.unfinished is not None:
            self._hold([self.unfinished], sink)
            self.unfinished = None

    def _end_fact(self, end: float, sink: RestartSink) -> None:
        assert self.fact is not None
        sink.ended(self.rank, self.fact, end, self.fact_restart)
        self.fact, self.fact_restart = None, 0.0

    def _new_process(self, ev: Event, sink: RestartSink) -> None:
        if ev.restart > self.restart:
            level, launch = RestartLevel.INJOB, str(ev.restart)
        elif (relaunch := sink.relaunch(self.t, ev.mono)) is not None:
            # Restarted by the same launcher without a failure of its own (another pod's worker
            # failed, or a pod joined: a new rendezvous round), which keeps the restart count.
            level, launch = RestartLevel.INJOB, f"{ev.restart}@{relaunch!r}"
            self.cause = self.cause or "restarted by its launcher for a new rendezvous round"
            self.why = self.why or FaultCause.PEER_FAULT
        else:
            self.gen += 1
            level, launch = RestartLevel.POD, str(ev.restart)
        self._begin(f"injob/{self.gen}/{launch}" if level is RestartLevel.INJOB else f"pod/{self.gen}",
                    level, sink, inprocess=False)
        self.pid, self.restart, self.iter, self.inproc, self.launch = ev.pid, ev.restart, ev.iter, 0, launch

    def _inprocess(self, sink: RestartSink) -> None:
        self.inproc += 1
        self._begin(f"inprocess/{self.gen}/{self.launch}/{self.inproc}", RestartLevel.INPROCESS, sink, inprocess=True)

    # --- events ------------------------------------------------------------------------------
    def apply(self, ev: Event, sink: RestartSink) -> None:
        if isinstance(ev, Step) and ev.pid == self.pid and ev.iter <= self.iter:  # the hot path
            self._step(ev, sink)
            self.last_wall = ev.wall
            return
        if isinstance(ev, LauncherWorkerExit):  # written by the launcher (its pid), about this rank's process
            if ev.worker_pid == self.pid and self.first is not None:
                stop = sink.stopped_by(ev.mono)  # the launcher was stopped: so were its workers, whatever it sent them
                why = causes.of_exit(ev.signal, ev.exit_code) if stop is None else causes.of_exit(stop, None)
                self._died(ev.mono, ev.wall, None, why)
            return
        self._incarnation(ev, sink)
        if isinstance(ev, Step):
            self._step(ev, sink)
            self.last_wall = ev.wall
            return
        if isinstance(ev, Blocked) and ev.blocked_s:
            self._blocked(begin(ev), ev.blocked_s)
        self._event(ev, sink)
        if isinstance(ev, CheckpointEnd) and ev.ok:
            self._decide(ev.step, False, sink)
        self.last_wall = ev.wall

    def apply_many(self, records: Sequence[Event], sink: RestartSink) -> None:
        """``apply`` each record in order; the steps of its process a stretch at a time."""
        i, n = 0, len(records)
        while i < n:
            j = self._steps(records, i, sink)
            if j == i:
                self.apply(records[i], sink)
                j += 1
            i = j

    def _incarnation(self, ev: Event, sink: RestartSink) -> None:
        """Whose record ``ev`` is: the rank's first, a new process's (a restart) or a new Wrapper
        iteration's (an in-process restart)."""
        if self.first is None:
            self.first = self.t = min(ev.mono, begin(ev))
            self.pid, self.restart, self.iter, self.last_wall = ev.pid, ev.restart, ev.iter, ev.wall
            self.launch = str(ev.restart)
        elif ev.pid != self.pid:
            self._new_process(ev, sink)
        elif (ev.iter > self.iter or isinstance(ev, INPROCESS_FAULT)) and not (
                self.state is RankState.RESTART and self.fact_inprocess and not self.fact_reinit):
            self._inprocess(sink)  # not while one is under way, unless it failed after re-initialising
        if ev.iter > self.iter:
            self.iter = ev.iter

    def _event(self, ev: Event, sink: RestartSink) -> None:
        """What a record other than a step does to the loop's state and time."""
        mono = ev.mono
        if isinstance(ev, CheckpointStart):
            self._advance(mono)
            if self.state is not RankState.RESTART:
                self.blocking = ev.ckpt
        elif isinstance(ev, CheckpointScheduled) or (isinstance(ev, CheckpointEnd) and self.blocking == ev.ckpt):
            if self.blocking == ev.ckpt:
                self._advance(mono)
                self.blocking = None
        elif isinstance(ev, CheckpointFinalize):
            self._span(ev.start, mono, BLOCKING)
        elif isinstance(ev, UserSpan):
            name = ev.name[:64] if ev.name[:64] in self.user or len(self.user) < USER_NAMES else OTHER_NAME
            self.user[name] = self.user.get(name, 0.0) + self._span(ev.start, mono, USER)
        elif isinstance(ev, Restore):
            self._span(ev.start, mono, RESTORE)
            self._decide(ev.step, True, sink)
        elif isinstance(ev, FaultInjected):
            self._advance(mono)
            self.fault, self.fault_wall, self.cause = mono, ev.wall, f"injected {ev.kind}"
        elif isinstance(ev, StepFailed):
            self._advance(ev.start)
            self._died(mono, ev.wall, ev.error, causes.of_error(ev.error))
        elif isinstance(ev, ProcessStart):
            self._advance(mono)
            if self.fact is not None:
                sink.mark(self.rank, self.fact, RestartPhase.REINIT, mono)
        elif isinstance(ev, (ProcessEnd, InprocessCompletion)):
            # the loop is over: from its last step or save to the process's (and the job's) end is
            # shutdown (writer stop, completion barrier, process-group teardown). A loop that faulted
            # did not end: from its fault on, its time is the restart's that follows (if none does,
            # shutdown to the job's end)
            if self.fault is None:
                if self.state is RankState.TRAINING:
                    self.state = RankState.ENDED
                self._advance(mono)
            if isinstance(ev, ProcessEnd):
                self.state = RankState.ENDED
        elif (phase := _MARKS.get(ev.type)) is not None:
            self._advance(mono)
            if isinstance(ev, Cause) and ev.cause and self.fact is not None:
                sink.cause(self.rank, self.fact, ev.cause)
            if self.fact is not None and self.state is RankState.RESTART:
                sink.mark(self.rank, self.fact, phase, mono)
                self.fact_reinit = self.fact_reinit or phase is RestartPhase.REINIT

    def _died(self, mono: float, wall: float, cause: str | None, why: FaultCause) -> None:
        """The loop stopped at ``mono`` (an exception left a step, the process was killed): the
        unfinished step until then waits for the restart it joins (``unfinished``; a save in
        progress is blocking), and the fault is dated there, unless the loop had already stopped
        (a restart under way, an earlier fault, a clean end). A fault the loop marked itself
        (``fault_injected``) takes its cause from here, and its text too where the fault has words
        of its own (``cause``: an exception's; a killed process has none, so the mark says what it was)."""
        if self.state not in (RankState.TRAINING, RankState.INIT):
            return
        if self.fault is not None and self.why is None and cause is not None:
            self.cause = cause
        self.why = self.why or why
        if self.fault is not None or mono <= self.t:
            return
        if self.blocking is None:
            self.unfinished = Held(mono, mono - self.t, why)
        else:
            self.seconds[BLOCKING] += mono - self.t
        self.t = mono
        self.fault, self.fault_wall, self.cause = mono, wall, cause or "worker process exited"

    def _steps(self, records: Sequence[Event], i: int, sink: RestartSink) -> int:
        """Apply the steps of its process from ``records[i]`` on, in order, up to the first other
        record; returns its index. The hot path (a journal is mostly steps): a step of a loop that
        trains, with no waits on saves to book, is applied here with the ledger's time and pool in
        locals; any other goes through ``_step``."""
        pid, it, n = self.pid, self.iter, len(records)
        plain = self.state is RankState.TRAINING and self.blocking is None and self.fact is None and self.fault is None
        t, pool, seconds = self.t, self.pool, self.seconds
        pool_sum, idle, data_s = pool.sum, seconds[UNATTRIBUTED], seconds[DATA]
        steps, work_s, firsts, lasts = pool.steps, pool.work, pool.first, pool.last
        j = i
        while j < n:
            ev = records[j]
            if type(ev) is not _STEP or ev.pid != pid or ev.iter > it:
                break
            j += 1
            if ev.blocked_s or not plain:
                self.t, pool.sum, seconds[UNATTRIBUTED], seconds[DATA] = t, pool_sum, idle, data_s
                self._step(ev, sink)
                t, pool_sum, idle, data_s, plain = self.t, pool.sum, seconds[UNATTRIBUTED], seconds[DATA], True
                steps, work_s, firsts, lasts = pool.steps, pool.work, pool.first, pool.last
                continue
            start, mono = ev.start, ev.mono
            if start > t:  # the gap before it: the loop trained, so it is unattributed
                idle += start - t
                t = start
            span = mono - t
            if span > 0:
                data: float = ev.data_s
                data = span if data > span else (data if data > 0.0 else 0.0)
                data_s += data
                work = span - data
                steps.append(ev.step)
                work_s.append(work)
                firsts.append(mono)
                lasts.append(mono)
                pool_sum += work
                t = mono
                if len(steps) > POOL_MAX:
                    pool.compact()
                    steps, work_s, firsts, lasts = pool.steps, pool.work, pool.first, pool.last
        if j > i:
            self.t, pool.sum, seconds[UNATTRIBUTED], seconds[DATA] = t, pool_sum, idle, data_s
            self.last_wall = records[j - 1].wall
        return j

    def _step(self, ev: Step, sink: RestartSink) -> None:
        """One step, whatever the loop's state: the gap before it goes where the state says (a
        restart it ends, a save blocking), and its waits on saves are booked as blocking."""
        start: float = ev.start
        mono = ev.mono
        t = self.t
        seconds = self.seconds
        blocked: float | None = ev.blocked_s  # the loop's waits on saves since the previous record
        before = inside = 0.0  # of blocked: booked from the stretch before the span, from the span
        if start > t:  # _advance, with the waits taken out of the gap
            gap = start - t
            if blocked:
                before = blocked if blocked < gap else gap
                seconds[BLOCKING] += before
                gap -= before
                blocked -= before
            idx = BLOCKING if self.blocking is not None else GAP[self.state]
            seconds[idx] += gap
            if idx == RESTART:
                self.fact_restart += gap
            t = self.t = start
        if self.fact is not None:
            self._end_fact(t, sink)
        if self.unfinished is not None:  # the loop went on after its fault without a restart
            self._lose_unfinished()
        self.state, self.blocking, self.fault, self.cause, self.why = RankState.TRAINING, None, None, None, None
        span = mono - t
        if span > 0:
            data: float = ev.data_s
            data = span if data > span else (data if data > 0.0 else 0.0)
            work = span - data
            if blocked:  # what the gap could not hold was inside the span (CUDA timing ends it late)
                inside = blocked if blocked < work else work
                seconds[BLOCKING] += inside
                work -= inside
            seconds[DATA] += data
            pool = self.pool
            pool.steps.append(ev.step)
            pool.work.append(work)
            pool.first.append(mono)
            pool.last.append(mono)
            pool.sum += work
            self.t = mono
            if len(pool.steps) > POOL_MAX:
                pool.compact()
        if (before or inside) and self.waits is not None:
            self.waits.append((t - before, t + inside))

    def copy(self) -> Ledger:
        return dataclasses.replace(
            self, seconds=self.seconds[:], pool=self.pool.copy(),
            verdicts=None if self.verdicts is None else self.verdicts[:],
            waits=None if self.waits is None else self.waits[:], user=dict(self.user), lost_by=self.lost_by[:])
