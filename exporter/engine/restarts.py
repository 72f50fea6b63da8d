"""Pod-level restarts: every rank's view of one restart, merged into one record and counted once.

Ranks report a restart under a shared key (see ``accounting``). The record's fault instant is
the earliest fault any rank journaled (a step that raised, a worker's exit; the reference job's
``fault_injected`` where nothing else dated it), else the earliest rank's last event before it
died; it ends when the *last* rank starts its first step again (a job in lock step trains only
when every rank does), so ``duration`` = max(rank ends) − fault.

What a rank spent after that instant is the restart's (its detection), not lost work: a peer
blocked in a collective until it failed, or a step it finished after the fault and the restore
rolled back. Which of a rank's seconds those are waits for the instant, and so for every rank
that joins: each rank hands the restart the seconds it would have booked lost in its wake (its
unfinished step, the work its restore rolled back: ``Held``), they stay unprotected, and when
the restart folds (``fold``, ``settle``; ``release`` once the job is over) they are split at the
instant — lost before it, restart after — and handed back to the ranks' ledgers (``Credit``).

Phases are consecutive stretches between journaled instants, in this order:

========== ================================== =============================================
phase      in-process (Wrapper callbacks)     in-job / pod (ft_launcher events, rank starts)
========== ================================== =============================================
detect     → first ``inprocess_abort``        → ``launcher_failure_detected`` (pod: new
                                              ``launcher_start``)
teardown   → last ``inprocess_finalize``      → ``launcher_workers_terminated``
rendezvous → last ``inprocess_rank_assignment`` → ``launcher_rendezvous_done``
reinit     → last ``inprocess_initialize``    → last restarted ``process_start``
restore    → the last rank's first step       → the last rank's first step
========== ================================== =============================================

A phase whose instant was not journaled is left out and its time goes to the next phase that
was, so the phases of a finished restart always sum to its duration. A restart enters the
counters at once and the duration and phase histograms once nothing can join it any more
(see ``Restarts.fold``), or when the job is over (``Restarts.settle``).

Its cause (``causes``) is its faulting rank's: the first rank, in the order that picks its fault
instant, whose own fault was journaled with one, a rank that a peer's going failed (``peer_fault``)
only where no rank's own fault was; else what the Wrapper's callbacks said of it (a
timeout is a hang); else who restarted it: a launcher that started workers again for another
pod's fault (``peer_fault``), or one that found its workers unhealthy with none of them gone or
raising (``hang``); else ``unknown``. The lost and restart seconds every rank booked in it are
charged to that cause when it folds (``lost_by``/``restart_by``): by then every rank read has
joined; a rank's unfinished step, up to the fault instant, to the cause its own fault journaled. A
rank whose records are read only after the restart folded joins none: the folded restart splits
what it would have held at once, at its fault instant (``split_late``), and charges that and the
restart seconds the rank books in it to its cause; its instant and cause stand (the late rank's own
fault, had it been first, no longer moves them).
"""

from __future__ import annotations

import dataclasses
from bisect import bisect_left, insort
from collections.abc import Mapping
from dataclasses import dataclass, field

from nvrx_slo.contracts.catalogue import FaultCause, RestartLevel, RestartPhase
from nvrx_slo.contracts.schema import EventType
from nvrx_slo.exporter.engine import causes
from nvrx_slo.exporter.engine.histogram import Buckets, RestartBuckets
from nvrx_slo.exporter.engine.restart_sink import Credit, Folded, Held, split
from nvrx_slo.exporter.engine.snapshot import RestartRecord, RestartStats

RECENT = 32  # finished restarts kept for the status page
LAUNCHER_KEPT = 4096  # ft_launcher events kept for phase boundaries
_LAUNCHER_MARKS = {
    RestartLevel.INJOB: {RestartPhase.DETECT: EventType.LAUNCHER_FAILURE_DETECTED,
                         RestartPhase.TEARDOWN: EventType.LAUNCHER_WORKERS_TERMINATED,
                         RestartPhase.RENDEZVOUS: EventType.LAUNCHER_RENDEZVOUS_DONE},
    RestartLevel.POD: {RestartPhase.DETECT: EventType.LAUNCHER_START,
                       RestartPhase.RENDEZVOUS: EventType.LAUNCHER_RENDEZVOUS_DONE},
}
_CHAIN = (RestartPhase.DETECT, RestartPhase.TEARDOWN, RestartPhase.RENDEZVOUS, RestartPhase.REINIT)

LauncherMark = tuple[float, EventType]  # (mono, type) of an ft_launcher record


@dataclass(frozen=True, slots=True)
class Fault:
    """Where one rank's loop stopped: the journaled fault instant, or its last record (a bound)."""

    mono: float
    wall: float
    journaled: bool


@dataclass(slots=True)
class OpenRestart:
    """One restart still gathering ranks: per-rank faults and ends, merged phase instants."""

    level: RestartLevel
    faults: dict[int, Fault] = field(default_factory=dict)
    ends: dict[int, float] = field(default_factory=dict)
    marks: dict[RestartPhase, float] = field(default_factory=dict)  # detect: earliest rank; the others: latest
    causes: dict[int, str] = field(default_factory=dict)
    whys: dict[int, FaultCause] = field(default_factory=dict)  # per rank: the cause its own fault journaled
    hints: dict[int, FaultCause] = field(default_factory=dict)  # per rank: what the Wrapper's callbacks said
    held: dict[int, list[Held]] = field(default_factory=dict)  # per rank: until the fault instant decides them
    lost: float = 0.0  # rank-seconds of work its restores rolled back, up to the fault instant
    restart: float = 0.0  # rank-seconds restarting: each rank's part as it ends, and what held turned out to be

    def copy(self) -> OpenRestart:
        return OpenRestart(self.level, dict(self.faults), dict(self.ends), dict(self.marks), dict(self.causes),
                           dict(self.whys), dict(self.hints), {r: held[:] for r, held in self.held.items()},
                           self.lost, self.restart)

    def done(self) -> bool:
        return len(self.ends) == len(self.faults)

    def order(self) -> list[int]:
        """Its ranks, the one whose fault is the restart's first: a journaled fault instant (a step
        that raised, a worker's exit, an injected fault) is the true one; a last event only bounds it."""
        return sorted(self.faults, key=lambda r: (not self.faults[r].journaled, self.faults[r].mono, r))


@dataclass(slots=True)
class Restarts:
    """The ``RestartSink`` the ledgers report to, plus the folded history. ``keep``: finished
    restarts kept as records (None: all, for an offline replay)."""

    keep: int | None = RECENT
    open: dict[str, OpenRestart] = field(default_factory=dict)
    # folded restarts by key: a rank whose records are read after its restart folded joins none,
    # its seconds in it are split and charged as the restart's own were
    folded: dict[str, Folded] = field(default_factory=dict)
    counts: dict[RestartLevel, int] = field(default_factory=lambda: dict.fromkeys(RestartLevel, 0))
    duration: dict[RestartLevel, RestartBuckets] = field(
        default_factory=lambda: {level: RestartBuckets() for level in RestartLevel})
    phases: dict[RestartLevel, dict[RestartPhase, RestartBuckets]] = field(
        default_factory=lambda: {level: {phase: RestartBuckets() for phase in RestartPhase} for level in RestartLevel})
    recent: list[RestartRecord] = field(default_factory=list)  # oldest first, ``keep`` at most
    launcher: list[LauncherMark] = field(default_factory=list)  # sorted
    ended_since_fold: bool = False
    # folded restarts' lost and restart rank-seconds by cause (``causes.INDEX``)
    lost_by: list[float] = field(default_factory=causes.zeros)
    restart_by: list[float] = field(default_factory=causes.zeros)
    stops: list[tuple[float, int]] = field(default_factory=list)  # (mono, signal) the launcher was told to stop by

    # --- the sink ------------------------------------------------------------------------------
    def began(self, rank: int, key: str, level: RestartLevel, fault: float, fault_wall: float,
              injected: bool, cause: str | None, why: FaultCause | None) -> None:
        if key in self.folded:
            return
        rec = self.open.get(key)
        if rec is None:
            rec = self.open[key] = OpenRestart(level)
        rec.faults[rank] = Fault(fault, fault_wall, injected)
        if cause:
            rec.causes[rank] = cause
        if why is not None:
            rec.whys[rank] = why

    def mark(self, rank: int, key: str, phase: RestartPhase, mono: float) -> None:
        rec = self.open.get(key)
        if rec is not None:
            old = rec.marks.get(phase)
            if old is None or (mono < old if phase is RestartPhase.DETECT else mono > old):
                rec.marks[phase] = mono

    def cause(self, rank: int, key: str, cause: str) -> None:
        rec = self.open.get(key)
        if rec is not None:
            rec.causes.setdefault(rank, cause)
            if rec.hints.get(rank) is not FaultCause.HANG:  # a timeout says more than the exception it raised
                rec.hints[rank] = causes.of_interruption(cause)

    def hold(self, rank: int, key: str, held: list[Held]) -> bool:
        rec = self.open.get(key)
        if rec is None or rank not in rec.faults:
            return False
        rec.held.setdefault(rank, []).extend(held)
        return True

    def split_late(self, rank: int, key: str, held: list[Held]) -> Credit | None:
        folded = self.folded.get(key)
        if folded is None:
            return None
        credit, rolled_back = split(rank, held, folded.fault, self.lost_by)
        self.lost_by[causes.INDEX[folded.cause]] += rolled_back
        self.restart_by[causes.INDEX[folded.cause]] += credit.restart
        return credit

    def ended(self, rank: int, key: str, end: float, restart: float) -> None:
        rec = self.open.get(key)
        if rec is not None and rank in rec.faults:
            if rank not in rec.ends:
                rec.restart += restart
            rec.ends[rank] = end
            self.ended_since_fold = True
        elif key in self.folded:
            self.restart_by[causes.INDEX[self.folded[key].cause]] += restart

    def launcher_event(self, kind: EventType, mono: float) -> None:
        insort(self.launcher, (mono, kind))
        if len(self.launcher) > LAUNCHER_KEPT:
            del self.launcher[0]

    def stop(self, mono: float, signal: int) -> None:
        insort(self.stops, (mono, signal))
        if len(self.stops) > LAUNCHER_KEPT:
            del self.stops[0]

    def stopped_by(self, at: float) -> int | None:
        """The signal the pod's launcher was last told to stop by at or before ``at``, if no
        launcher started since: the workers ending then ended for it."""
        i = bisect_left(self.stops, (at, 1 << 30))
        if not i:
            return None
        since, signal = self.stops[i - 1]
        started = self._first_launcher(EventType.LAUNCHER_START, since, at)
        return signal if started is None else None

    def workers_started(self) -> float:
        """The instant the pod's launcher last started workers (-inf: it never did): its last round
        begins there."""
        return next((at for at, kind in reversed(self.launcher) if kind is EventType.LAUNCHER_WORKER_START),
                    float("-inf"))

    def relaunch(self, since: float, until: float) -> float | None:
        started = None
        for mono, kind in self.launcher[bisect_left(self.launcher, (since, "\uffff")):]:
            if mono > until:
                break
            if kind is EventType.LAUNCHER_START:
                return None
            if kind is EventType.LAUNCHER_WORKER_START:
                started = mono
        return started

    def tearing_down(self, mono: float) -> bool:
        """Whether the launcher had detected a failure at ``mono`` and not started workers since:
        the workers that end then are the ones it stops, not faults (they stay in ``restart``)."""
        for at, kind in reversed(self.launcher):
            if at <= mono and kind in (EventType.LAUNCHER_FAILURE_DETECTED, EventType.LAUNCHER_WORKER_START):
                return kind is EventType.LAUNCHER_FAILURE_DETECTED
        return False

    # --- records -------------------------------------------------------------------------------
    def _first_launcher(self, kind: EventType, after: float, until: float | None) -> float | None:
        for mono, k in self.launcher[bisect_left(self.launcher, (after, "")):]:
            if until is not None and mono > until:
                return None
            if k is kind:
                return mono
        return None

    def record(self, rec: OpenRestart) -> RestartRecord:
        order = rec.order()
        first = rec.faults[order[0]]
        fault = first.mono
        end = max(rec.ends.values()) if rec.done() else None
        instants: dict[RestartPhase, float | None] = {}
        launcher = _LAUNCHER_MARKS.get(rec.level)
        for phase in _CHAIN:
            if launcher is None or phase is RestartPhase.REINIT:
                instants[phase] = rec.marks.get(phase)
            else:
                kind = launcher.get(phase)
                instants[phase] = None if kind is None else self._first_launcher(kind, fault, end)
        instants[RestartPhase.RESTORE] = end
        phases: dict[RestartPhase, float] = {}
        prev = fault
        for phase, at in instants.items():
            if at is None:
                continue
            at = max(at, prev) if end is None else min(max(at, prev), end)
            phases[phase] = at - prev
            prev = at
        own = [r for r in order if rec.whys.get(r) not in (None, FaultCause.PEER_FAULT)]
        cause = next((rec.causes[r] for r in own + order if r in rec.causes), None)  # the faulting rank's first
        return RestartRecord(rec.level, cause, first.wall, None if end is None else end - fault, phases,
                             len(rec.faults), first.journaled, self._why(rec, own + order, fault, end), rec.lost,
                             rec.restart)

    def _why(self, rec: OpenRestart, order: list[int], fault: float, end: float | None) -> FaultCause:
        """The restart's cause (see the module docstring)."""
        why = next((rec.whys[r] for r in order if r in rec.whys), None)
        if why is not None:
            return why
        if rec.hints:
            return FaultCause.HANG if FaultCause.HANG in rec.hints.values() else next(iter(rec.hints.values()))
        if rec.level is RestartLevel.INJOB and \
                self._first_launcher(EventType.LAUNCHER_FAILURE_DETECTED, fault, end) is not None:
            return FaultCause.HANG
        return FaultCause.UNKNOWN

    @staticmethod
    def _observe(record: RestartRecord, duration: Mapping[RestartLevel, Buckets],
                 phases: Mapping[RestartLevel, Mapping[RestartPhase, Buckets]]) -> None:
        if record.duration_s is not None:
            duration[record.level].observe(record.duration_s)
        for phase, seconds in record.phases.items():
            phases[record.level][phase].observe(seconds)

    def fold(self, newest: float, window: float, applied: dict[int, float], first: dict[int, float]) -> list[Credit]:
        """Move finished restarts into the histograms once nothing can join them any more; returns
        what they decided of their ranks' held seconds.

        That is: every rank that reported it has ended it, the newest record in the pod is
        ``window`` past its end, and every other rank that was up before the end has applied
        its own records past the end without joining (``applied``/``first``: per rank, the
        newest applied and the oldest seen monotonic instant).
        """
        self.ended_since_fold = False
        credits: list[Credit] = []
        for key, rec in list(self.open.items()):
            if not rec.done():
                continue
            end = max(rec.ends.values())
            if end + window > newest or any(rank not in rec.faults and first[rank] < end and applied[rank] < end
                                            for rank in applied):
                continue
            credits += self._fold(key, rec)
        return credits

    def settle(self) -> list[Credit]:
        """Fold every restart all its ranks ended: nothing more will join them (``Engine.settle``)."""
        credits: list[Credit] = []
        for key, rec in list(self.open.items()):
            if rec.done():
                credits += self._fold(key, rec)
        return credits

    def release(self) -> list[Credit]:
        """The job is over: no rank joins the restarts still open, so their fault instants stand;
        split what they hold (``Engine`` at the job's end, after ``settle``)."""
        return [credit for rec in self.open.values() for credit in self.split(rec)]

    def held(self, rank: int) -> float:
        """The rank's seconds the open restarts hold undecided (part of its unprotected time)."""
        return sum(h.seconds for rec in self.open.values() for h in rec.held.get(rank, ()))

    def split(self, rec: OpenRestart) -> list[Credit]:
        """Decide what ``rec``'s ranks held, at its fault instant: lost before it (the unfinished
        steps' to their own faults' causes, at once), restart after it."""
        if not rec.held:
            return []
        fault = rec.faults[rec.order()[0]].mono
        credits = []
        for rank, held in rec.held.items():
            credit, rolled_back = split(rank, held, fault, self.lost_by)
            rec.lost += rolled_back
            rec.restart += credit.restart
            credits.append(credit)
        rec.held = {}
        return credits

    def _fold(self, key: str, rec: OpenRestart) -> list[Credit]:
        del self.open[key]
        credits = self.split(rec)
        record = self.record(rec)
        self.counts[rec.level] += 1
        self.lost_by[causes.INDEX[record.fault]] += record.lost_s
        self.restart_by[causes.INDEX[record.fault]] += record.restart_s
        self._observe(record, self.duration, self.phases)
        self.recent.append(record)
        if self.keep is not None and len(self.recent) > self.keep:
            del self.recent[0]
        self.folded[key] = Folded(rec.faults[rec.order()[0]].mono, record.fault)
        return credits

    def copy(self) -> Restarts:
        """A copy whose open restarts can take more events, and whose ranks can end folded ones; the
        rest of the folded history is shared, read-only."""
        return dataclasses.replace(self, open={k: rec.copy() for k, rec in self.open.items()},
                                   lost_by=self.lost_by[:], restart_by=self.restart_by[:])

    def stats(self, mtbf_s: float | None, launcher_remaining: int | None) -> RestartStats:
        counts = dict(self.counts)
        for rec in self.open.values():
            counts[rec.level] += 1
        recent = self.records()
        return RestartStats(counts, {k: b.frozen() for k, b in self.duration.items()},
                            {(level, k): b.frozen() for level, by in self.phases.items() for k, b in by.items()},
                            mtbf_s, tuple(recent[-RECENT:]), launcher_remaining)

    def caused(self, finished: bool, pending: list[tuple[str, float]]) -> tuple[list[float], list[float]]:
        """The lost and restart rank-seconds charged to each cause (``causes.INDEX``): the folded
        restarts', and once the job finished every open one's too, with ``pending``: the (restart,
        restart seconds) ranks booked in restarts their part of which never ended."""
        lost, restart = self.lost_by[:], self.restart_by[:]
        if finished:
            whys = {key: self.record(rec) for key, rec in self.open.items()}
            for record in whys.values():
                lost[causes.INDEX[record.fault]] += record.lost_s
                restart[causes.INDEX[record.fault]] += record.restart_s
            for key, restart_s in pending:
                cause = whys[key].fault if key in whys else \
                    self.folded[key].cause if key in self.folded else FaultCause.UNKNOWN
                restart[causes.INDEX[cause]] += restart_s
        return lost, restart

    def records(self) -> list[RestartRecord]:
        """The kept finished restarts, then the open ones, each oldest first."""
        return list(self.recent) + sorted(map(self.record, self.open.values()), key=lambda r: r.fault_wall)

    def faults(self) -> int:
        return sum(self.counts.values()) + len(self.open)

    def mean_duration(self) -> float | None:
        n = sum(b.count for b in self.duration.values())
        return sum(b.sum for b in self.duration.values()) / n if n else None

