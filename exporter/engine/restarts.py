"""Pod-level restarts: every rank's view of one restart, merged into one record and counted once.

Ranks report a restart under a shared key (see ``accounting``). The record's fault instant is
the earliest FAULT_INJECTED any rank journaled, else the earliest rank's last event before it
died; it ends when the *last* rank starts its first step again (a job in lock step trains only
when every rank does), so ``duration`` = max(rank ends) − fault.

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
(see ``Restarts.fold``), or when the job finished.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from typing import Any

from nvrx_slo.contracts.catalogue import RESTART_BUCKETS, RestartLevel, RestartPhase
from nvrx_slo.exporter.engine.histogram import Buckets
from nvrx_slo.exporter.engine.snapshot import RestartRecord, RestartStats

RECENT = 32  # finished restarts kept for the status page
LAUNCHER_KEPT = 4096  # ft_launcher events kept for phase boundaries
_LAUNCHER_MARKS = {
    RestartLevel.INJOB: {RestartPhase.DETECT: "launcher_failure_detected",
                         RestartPhase.TEARDOWN: "launcher_workers_terminated",
                         RestartPhase.RENDEZVOUS: "launcher_rendezvous_done"},
    RestartLevel.POD: {RestartPhase.DETECT: "launcher_start",
                       RestartPhase.RENDEZVOUS: "launcher_rendezvous_done"},
}
_CHAIN = (RestartPhase.DETECT, RestartPhase.TEARDOWN, RestartPhase.RENDEZVOUS, RestartPhase.REINIT)


class _Open:
    """One restart still gathering ranks: per-rank faults and ends, merged phase instants."""

    __slots__ = ("level", "faults", "ends", "marks", "causes")

    def __init__(self, level: RestartLevel) -> None:
        self.level = level
        self.faults: dict[int, tuple[float, float, bool]] = {}  # rank -> (mono, wall, injected)
        self.ends: dict[int, float] = {}
        self.marks: dict[str, float] = {}  # detect: earliest rank; the others: latest rank
        self.causes: dict[int, str] = {}

    def copy(self) -> _Open:
        out = _Open(self.level)
        out.faults, out.ends = dict(self.faults), dict(self.ends)
        out.marks, out.causes = dict(self.marks), dict(self.causes)
        return out

    def done(self) -> bool:
        return len(self.ends) == len(self.faults)


class Restarts:
    """The ``RestartSink`` the ledgers report to, plus the folded history."""

    def __init__(self, keep: int | None = RECENT) -> None:
        """``keep``: finished restarts kept as records (None: all, for an offline replay)."""
        self.open: dict[str, _Open] = {}
        self.folded: set[str] = set()
        self.counts = {level: 0 for level in RestartLevel}
        self.duration = {level: Buckets(RESTART_BUCKETS) for level in RestartLevel}
        self.phases = {(lv, ph): Buckets(RESTART_BUCKETS) for lv in RestartLevel for ph in RestartPhase}
        self.recent: deque[RestartRecord] = deque(maxlen=keep)
        self.launcher: list[tuple[float, str]] = []
        self.ended_since_fold = False

    # --- the sink ------------------------------------------------------------------------------
    def began(self, rank: int, key: str, level: RestartLevel, fault: float, fault_wall: float,
              injected: bool, cause: str | None) -> None:
        if key in self.folded:
            return
        rec = self.open.get(key)
        if rec is None:
            rec = self.open[key] = _Open(level)
        rec.faults[rank] = (fault, fault_wall, injected)
        if cause:
            rec.causes[rank] = cause

    def mark(self, rank: int, key: str, phase: str, mono: float) -> None:
        rec = self.open.get(key)
        if rec is not None:
            old = rec.marks.get(phase)
            if old is None or (mono < old if phase == RestartPhase.DETECT.value else mono > old):
                rec.marks[phase] = mono

    def cause(self, rank: int, key: str, cause: str) -> None:
        rec = self.open.get(key)
        if rec is not None:
            rec.causes.setdefault(rank, cause)

    def ended(self, rank: int, key: str, end: float) -> None:
        rec = self.open.get(key)
        if rec is not None and rank in rec.faults:
            rec.ends[rank] = end
            self.ended_since_fold = True

    def launcher_event(self, kind: str, mono: float) -> None:
        insort(self.launcher, (mono, kind))
        if len(self.launcher) > LAUNCHER_KEPT:
            del self.launcher[0]

    def relaunch(self, since: float, until: float) -> float | None:
        started = None
        for mono, kind in self.launcher[bisect_left(self.launcher, (since, "\uffff")):]:
            if mono > until:
                break
            if kind == "launcher_start":
                return None
            if kind == "launcher_worker_start":
                started = mono
        return started

    # --- records -------------------------------------------------------------------------------
    def _first_launcher(self, kind: str, after: float, until: float | None) -> float | None:
        for mono, k in self.launcher[bisect_left(self.launcher, (after, "")):]:
            if until is not None and mono > until:
                return None
            if k == kind:
                return mono
        return None

    def record(self, rec: _Open) -> RestartRecord:
        # a journaled fault instant (injected, a step that raised, a worker's exit) is the true one;
        # a rank's last event only bounds it from below
        order = sorted(rec.faults, key=lambda r: (not rec.faults[r][2], rec.faults[r][0], r))
        fault, fault_wall, journaled = rec.faults[order[0]]
        end = max(rec.ends.values()) if rec.done() else None
        instants: dict[RestartPhase, float | None] = {}
        launcher = _LAUNCHER_MARKS.get(rec.level)
        for phase in _CHAIN:
            if launcher is None or phase is RestartPhase.REINIT:
                instants[phase] = rec.marks.get(phase.value)
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
        cause = next((rec.causes[r] for r in order if r in rec.causes), None)  # the faulting rank's first
        return RestartRecord(rec.level, cause, fault_wall, None if end is None else end - fault, phases,
                             len(rec.faults), journaled)

    def _observe(self, record: RestartRecord, duration: dict[RestartLevel, Buckets],
                 phases: dict[tuple[RestartLevel, RestartPhase], Buckets]) -> None:
        if record.duration_s is not None:
            duration[record.level].observe(record.duration_s)
        for phase, seconds in record.phases.items():
            phases[(record.level, phase)].observe(seconds)

    def fold(self, newest: float, window: float, applied: dict[int, float], first: dict[int, float]) -> None:
        """Move finished restarts into the histograms once nothing can join them any more.

        That is: every rank that reported it has ended it, the newest record in the pod is
        ``window`` past its end, and every other rank that was up before the end has applied
        its own records past the end without joining (``applied``/``first``: per rank, the
        newest applied and the oldest seen monotonic instant).
        """
        self.ended_since_fold = False
        for key, rec in list(self.open.items()):
            if not rec.done():
                continue
            end = max(rec.ends.values())
            if end + window > newest or any(rank not in rec.faults and first[rank] < end and applied[rank] < end
                                            for rank in applied):
                continue
            del self.open[key]
            record = self.record(rec)
            self.counts[rec.level] += 1
            self._observe(record, self.duration, self.phases)
            self.recent.append(record)
            self.folded.add(key)

    def copy(self) -> Restarts:
        """A copy whose open restarts can take more events; the folded history is shared, read-only."""
        out = Restarts.__new__(Restarts)
        out.__dict__.update(self.__dict__)
        out.open = {k: rec.copy() for k, rec in self.open.items()}
        return out

    def stats(self, finished: bool, mtbf_s: float | None, launcher_remaining: int | None) -> RestartStats:
        counts = dict(self.counts)
        duration, phases = self.duration, self.phases
        open_records = [(rec, self.record(rec)) for rec in self.open.values()]
        if finished and any(rec.done() for rec, _ in open_records):
            duration = {k: b.copy() for k, b in duration.items()}
            phases = {k: b.copy() for k, b in phases.items()}
            for rec, record in open_records:
                if rec.done():
                    self._observe(record, duration, phases)
        for rec, _ in open_records:
            counts[rec.level] += 1
        recent = self.records()
        return RestartStats(counts, {k: b.frozen() for k, b in duration.items()},
                            {k: b.frozen() for k, b in phases.items()}, mtbf_s, tuple(recent[-RECENT:]),
                            launcher_remaining)

    def records(self) -> list[RestartRecord]:
        """The kept finished restarts, then the open ones, each oldest first."""
        return list(self.recent) + sorted(map(self.record, self.open.values()), key=lambda r: r.fault_wall)

    def faults(self) -> int:
        return sum(self.counts.values()) + len(self.open)

    def mean_duration(self) -> float | None:
        n = sum(b.count for b in self.duration.values())
        return sum(b.sum for b in self.duration.values()) / n if n else None

    # --- state ---------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        return {
            "open": {k: [r.level.value, {str(rank): list(v) for rank, v in r.faults.items()},
                         {str(rank): v for rank, v in r.ends.items()}, r.marks,
                         {str(rank): v for rank, v in r.causes.items()}] for k, r in self.open.items()},
            "folded": sorted(self.folded),
            "counts": {lv.value: n for lv, n in self.counts.items()},
            "duration": {lv.value: b.to_state() for lv, b in self.duration.items()},
            "phases": {f"{lv.value}/{ph.value}": b.to_state() for (lv, ph), b in self.phases.items()},
            "recent": [[r.level.value, r.cause, r.fault_wall, r.duration_s,
                        {ph.value: s for ph, s in r.phases.items()}, r.ranks, r.fault_journaled] for r in self.recent],
            "launcher": [list(x) for x in self.launcher],
            "ended_since_fold": self.ended_since_fold,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Restarts:
        out = cls()
        for key, (level, faults, ends, marks, causes) in state["open"].items():
            rec = out.open[key] = _Open(RestartLevel(level))
            rec.faults = {int(r): (float(v[0]), float(v[1]), bool(v[2])) for r, v in faults.items()}
            rec.ends = {int(r): v for r, v in ends.items()}
            rec.marks = dict(marks)
            rec.causes = {int(r): v for r, v in causes.items()}
        out.folded = set(state["folded"])
        out.counts = {RestartLevel(k): int(n) for k, n in state["counts"].items()}
        out.duration = {RestartLevel(k): Buckets.from_state(RESTART_BUCKETS, v) for k, v in state["duration"].items()}
        for key, value in state["phases"].items():
            level, phase = key.split("/")
            out.phases[(RestartLevel(level), RestartPhase(phase))] = Buckets.from_state(RESTART_BUCKETS, value)
        out.recent = deque((RestartRecord(RestartLevel(lv), cause, fw, d, {RestartPhase(p): s for p, s in ph.items()},
                                          n, bool(journaled))
                            for lv, cause, fw, d, ph, n, journaled in state["recent"]), maxlen=RECENT)
        out.launcher = [(float(m), str(k)) for m, k in state["launcher"]]
        out.ended_since_fold = bool(state["ended_since_fold"])
        return out
