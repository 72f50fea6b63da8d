"""The time-accounting engine: journal events in, a ``Snapshot`` out. Pure: no I/O, no threads,
no globals, no clock reads — the caller passes the clock to ``snapshot``.

Usage (one engine per pod journal)::

    engine = Engine()
    for event in events:                      # nvrx_slo.exporter.ingest.decode's events, any order
        engine.ingest(event)
    snap = engine.snapshot(time.monotonic(), time.time())
    state = engine.to_state()                 # JSON-safe; persist it with the reader's offsets
    engine = Engine.from_state(state)         # resume after a crash: nothing lost or counted twice

Views that draw more than a snapshot holds (the offline report's timeline) make the engine with
``keep_history=True`` and read what it decided — ``take_verdicts()`` (each step's productive/lost
decision) and ``history()`` (every restart and save) — rather than deciding it again.

Arrival order: records may arrive in any order within ``reorder_window_s`` of monotonic time per
rank (files read round-robin, threads writing slightly out of order); they are accounted exactly
as if they had arrived sorted. A record older than one the rank has already applied (one more
than the window behind its newest) is counted in ``Snapshot.late`` and left out of the rank's
time accounting, because the time it would change is settled in counters that never go down. A reader that
catches up on a backlog must therefore feed each rank's files oldest first (merging by ``mono``
is best). Duplicates by (pid, seq, mono) are counted and ignored (``dedupe``). See docs/accounting.md
for the model.

Plausibility: one schema-valid record with an absurd time would move every rank's wall for good
(a ``mono`` 8000 s early moves the origin; one in the future stretches a span), and negative
durations would take counters down. So ``ingest`` counts and drops (``Snapshot.implausible``) a
record whose times contradict themselves (``decode.self_consistent``: a span or save that ends
before it starts or lasts longer than a week, a step phase negative or longer than its span,
negative bytes, stage times or waits on saves), contradict its process's life (a span beginning more than the
reorder window before the process's first record; any record dated after the process ended, by
its own ``process_end`` or ``launcher_exit`` or its launcher's ``launcher_worker_exit``: a flood of
records claiming a finished process cannot stretch the job), or lie in the future of the
caller's clock (``not_after``: ``Live`` passes its monotonic clock plus a slack). A refused
record, like a duplicate, changes nothing but its count: every check reads state, and only an
accepted record writes it.

How: each rank keeps its not-yet-applied records sorted in a buffer; a record is applied to the
rank's ``Ledger`` once the rank's newest record is ``reorder_window_s`` past it, and only applied
records settle time, so settled seconds never go down whatever the arrival order. The rank's
time after its last applied record is provisional (``unprotected_s``) — the settled numbers lag
the journal by the window. Once the job finished, ``snapshot`` replays the buffers on copies and
settles everything. Counts that need no ordering (steps, the step histogram, the latest step,
worker liveness, checkpoint aggregates) are taken at ingest, without lag.

The clock: ``snapshot(now_mono, …)`` counts a running job's wall up to ``now_mono``, a finished
job's up to its last record. A finish read after a snapshot that showed the job running at a
later instant (the reader lagged) would take wall back, so the engine remembers the furthest
instant it has shown and never ends wall before it. Callers keep that rare by passing a *read
horizon* as ``now_mono`` — an instant before which every record has been ingested (``Live``
passes the start of its last complete journal poll) — so the finish lies after it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import msgspec

from nvrx_slo.contracts.catalogue import SETTLED_CATEGORIES, STEP_BUCKETS
from nvrx_slo.contracts.schema import CHECKPOINT_EVENTS, SPAN_EVENTS
from nvrx_slo.exporter.engine import derived
from nvrx_slo.exporter.engine.accounting import BLOCKING, GAP, INIT, LOST, PRODUCTIVE, Ledger
from nvrx_slo.exporter.engine.checkpoints import Checkpoints
from nvrx_slo.exporter.engine.dedupe import Seqs
from nvrx_slo.exporter.engine.histogram import Buckets
from nvrx_slo.exporter.engine.lanes import ProcessLanes
from nvrx_slo.exporter.engine.restarts import Restarts
from nvrx_slo.exporter.engine.snapshot import CheckpointRecord, CheckpointStats, RankSnapshot, RestartRecord, Snapshot
from nvrx_slo.exporter.ingest.decode import Event, as_event, self_consistent

__all__ = ["Engine", "Snapshot", "REORDER_WINDOW_S"]

REORDER_WINDOW_S = 10.0
STATE_VERSION = 10
FOLD_EVERY_S = 1.0  # finished restarts move into the histograms when one ends, and this often (journal time)
_DECIDING = frozenset(("checkpoint_end", "restore"))  # the records that can make a rank's work productive
RECENT_STEPS = 16  # step durations per rank for the skew ratio
_EPS = 1e-6  # float noise allowed where one instant must not lie past another
_ORDER = attrgetter("mono", "pid", "seq")  # the order records are applied in; unique per record
_ENDS = frozenset(("process_end", "launcher_exit", "launcher_worker_exit"))  # a process ended, by its or its launcher


class _Lane:
    """One rank: its ledger, its buffer of records not yet applied (sorted), and the per-rank
    counts that need no ordering."""

    __slots__ = ("ledger", "pending", "newest", "newest_pid", "newest_kind", "newest_restart",
                 "newest_iter", "applied",
                 "steps", "step", "step_mono", "step_wall", "hist", "recent", "worker", "worker_mono",
                 "worker_pid", "local_world_size", "pids", "last_restore_wall", "first_step_wall")

    def __init__(self, rank: int) -> None:
        self.ledger = Ledger(rank)
        self.pending: deque[Event] = deque()  # sorted by _ORDER
        self.newest = float("-inf")  # mono of the newest record
        self.newest_pid = -1
        self.newest_kind = ""
        self.newest_restart = 0
        self.newest_iter = 0
        self.applied: Event | None = None  # the last record applied
        self.steps = 0
        self.step: int | None = None  # of the newest step record
        self.step_mono = float("-inf")
        self.step_wall: float | None = None
        self.hist = Buckets(STEP_BUCKETS)
        self.recent: deque[float] = deque(maxlen=RECENT_STEPS)
        self.worker: bool | None = None
        self.worker_mono = float("-inf")
        self.worker_pid = -1
        self.local_world_size = 0  # the most workers its pod was said to run (0: not said)
        self.last_restore_wall: float | None = None  # Unix time of its newest restore
        self.first_step_wall: float | None = None  # Unix time its first step began
        self.pids: dict[int, float] = {}  # pid -> its oldest record's mono

    def count(self, record: Event, kind: str, mono: float) -> None:
        """The order-free per-rank counts."""
        if kind == "step":
            duration = mono - record.start
            self.steps += 1
            hist = self.hist  # Buckets.observe, inlined: once per step
            hist.counts[bisect_left(STEP_BUCKETS, duration)] += 1
            hist.sum += duration
            hist.count += 1
            self.recent.append(duration)
            if mono > self.step_mono:
                self.step, self.step_mono, self.step_wall = record.step, mono, record.wall
            begun = record.wall - duration
            if self.first_step_wall is None or begun < self.first_step_wall:
                self.first_step_wall = begun
        elif kind == "checkpoint_worker":
            if mono > self.worker_mono:
                self.worker, self.worker_mono, self.worker_pid = record.alive, mono, record.pid
        elif kind == "process_start":
            self.local_world_size = max(self.local_world_size, record.local_world_size or 0)
        elif kind == "restore":
            if self.last_restore_wall is None or record.wall > self.last_restore_wall:
                self.last_restore_wall = record.wall
        pid = record.pid
        if pid != self.newest_pid or mono < self.newest:  # else: its first record is older already
            first = self.pids.get(pid)
            if first is None or mono < first:
                self.pids[pid] = mono
        if mono > self.newest:
            self.newest, self.newest_pid, self.newest_kind = mono, pid, kind
            self.newest_restart, self.newest_iter = record.restart, record.iter

    def first(self) -> float:
        return min(self.pids.values())

    def pid_at(self, mono: float) -> int | None:
        """The process this rank ran at ``mono`` (the newest one started by then), None if none yet."""
        started = [(first, pid) for pid, first in self.pids.items() if first <= mono]
        return max(started)[1] if started else None

    def worker_alive(self) -> bool | None:
        """The newest process's async checkpoint worker, as it last reported (None: not yet)."""
        return self.worker if self.worker_pid == self.newest_pid else None


@dataclass(frozen=True)
class History:
    """Every restart and save the engine folded or still holds open, oldest first (``keep_history``)."""

    restarts: tuple[RestartRecord, ...]
    checkpoints: tuple[CheckpointRecord, ...]


# A step verdict: the steps of one rank that ended (mono) in [first, last] and were undecided
# until then are productive (True) or lost (False). See ``Ledger.verdicts``.
Verdict = tuple[float, float, bool]


class Engine:
    """Accounts one pod's journal. ``ingest`` costs a few µs per step event."""

    def __init__(self, reorder_window_s: float = REORDER_WINDOW_S, *, keep_history: bool = False) -> None:
        if reorder_window_s < 0:
            raise ValueError(f"reorder_window_s must be >= 0, got {reorder_window_s}")
        self.window = reorder_window_s
        self.keep_history = keep_history
        self._lanes: dict[int, _Lane] = {}
        self._lane_of = ProcessLanes()
        self._restarts = Restarts(None) if keep_history else Restarts()
        self._checkpoints = Checkpoints(reorder_window_s, None) if keep_history else Checkpoints(reorder_window_s)
        self._seen: dict[int, Seqs] = {}
        self._origin: float | None = None
        self._origin_wall: float | None = None
        self._newest = float("-inf")
        self._launcher_start: float | None = None
        self._launcher_exit: float | None = None
        self._max_restarts: int | None = None  # of the newest launcher_start
        self._launcher_ranks: int | None = None  # the workers the newest launcher_start said it starts
        self._launcher_world: int | None = None  # the job's ranks a launcher_start said (a fixed-size job)
        self._world_size: int | None = None  # the most ranks a process was started among
        self._identity = ("", "", "")
        self._accepted = 0  # the hot counter, apart from the rest
        self._counts = {"duplicates": 0, "out_of_order": 0, "late": 0, "implausible": 0, "records_lost": 0}
        self._pid_first: dict[int, float] = {}  # pid -> its start: its first record's (seq 0), else its earliest
        self._started: set[int] = set()  # pids whose first record (seq 0) was read: their start is known
        self._pid_end: dict[int, float] = {}  # pid -> the instant its process ended (its records end there)
        self._next_fold = float("-inf")
        self._shown = float("-inf")  # the furthest instant a snapshot counted wall to

    # --- ingest --------------------------------------------------------------------------------
    def _plausible(self, record: Event, kind: str, mono: float, begin: float, not_after: float) -> bool:
        """Whether the record may be accounted; changes nothing (a rejected record has no effect)."""
        if mono > not_after or not self_consistent(record, kind, begin):
            return False
        first = self._pid_first.get(record.pid)
        if first is not None and begin < first - self.window:
            return False
        end = self._pid_end.get(record.pid)
        return end is None or mono <= end + _EPS

    def _lived(self, record: Event, kind: str, begin: float) -> None:
        """What an accepted record says of its process's life: when it began, and when it ended
        (its own end, or its launcher's word that it exited)."""
        pid = record.pid
        first = self._pid_first.get(pid)
        if record.seq == 0:  # dated at the process's start: no later record walks it back a window at a time
            self._pid_first[pid] = begin if pid not in self._started else min(first or begin, begin)
            self._started.add(pid)
        elif first is None or begin < first and pid not in self._started:
            self._pid_first[pid] = begin
        if kind in _ENDS:
            ended = record.worker_pid if kind == "launcher_worker_exit" else pid
            self._pid_end[ended] = min(record.mono, self._pid_end.get(ended, float("inf")))

    def ingest(self, record: Event, not_after: float = float("inf")) -> bool:
        """Account one journal event (``nvrx_slo.exporter.ingest.decode``); ``not_after``: the latest
        ``mono`` that is not in the future of the caller's clock (see Plausibility above). Returns
        whether it was accepted: a record refused (implausible, a duplicate) changed nothing but
        its count."""
        pid: int = record.pid
        seq: int = record.seq
        mono: float = record.mono
        kind: str = record.type
        begin = record.start if kind in SPAN_EVENTS else mono
        if not self._plausible(record, kind, mono, begin, not_after):
            self._counts["implausible"] += 1
            return False
        seqs = self._seen.get(pid)
        if seqs is None:
            seqs = self._seen[pid] = Seqs()
        if seq == seqs.floor and not seqs.ahead:
            seqs.floor = seq + 1  # the common case: the next record of a file read in order
        else:
            duplicate, lost = seqs.seen(seq, mono, self.window)
            self._counts["records_lost"] += lost
            if duplicate:
                self._counts["duplicates"] += 1
                return False
        if pid not in self._started or kind in _ENDS:  # a started process's other records say nothing of its life
            self._lived(record, kind, begin)
        rank: int | None = record.rank
        if rank is not None:
            rank = self._lane_of.of(pid, rank, record.local_rank)
        if self._origin is None or begin < self._origin:
            self._origin, self._origin_wall = begin, record.wall - (mono - begin)
            if not self._identity[1]:
                self._identity = (record.job, record.pod, record.node)
        if mono > self._newest:
            self._newest = mono
        self._accepted += 1
        lane = None
        if rank is not None:
            lane = self._lanes.get(rank)
            if lane is None:
                lane = self._lanes[rank] = _Lane(rank)
                if self.keep_history:
                    lane.ledger.verdicts = []
            newest_pid = lane.newest_pid
            lane.count(record, kind, mono)
            if lane.newest_pid != newest_pid and self._checkpoints.open:
                self._checkpoints.due = self._newest  # a process died: its unfinished saves may fold
        if self._newest >= self._checkpoints.due:  # before adding: a new save never joins one that is over
            lanes = self._lanes
            self._checkpoints.fold(self._newest, self._live(), lambda r, at: lanes[r].pid_at(at))
        if lane is None:
            self._launcher(record, kind, mono)
            if kind == "launcher_worker_exit" and not self._tearing_down(mono):
                # a worker died on its own: the fault's instant, for its rank's ledger
                exited = next((lane for lane in self._lanes.values() if record.worker_pid in lane.pids), None)
                if exited is not None:
                    self._lane_ingest(exited, record)
        else:
            if kind in CHECKPOINT_EVENTS and self._checkpoints.add(record, lane.ledger.rank):
                lanes = self._lanes
                self._checkpoints.fold(self._newest, self._live(), lambda r, at: lanes[r].pid_at(at))
            elif kind == "process_start" and record.world_size > (self._world_size or 0):
                self._world_size = record.world_size
            self._lane_ingest(lane, record)
        if self._restarts.open and (self._newest >= self._next_fold or self._restarts.ended_since_fold):
            lanes = self._lanes
            applied = {r: float("-inf") if lane.applied is None else lane.applied.mono for r, lane in lanes.items()}
            self._restarts.fold(self._newest, self.window, applied, {r: lane.first() for r, lane in lanes.items()})
            self._next_fold = self._newest + FOLD_EVERY_S
        return True

    def _launcher(self, record: Event, kind: str, mono: float) -> None:
        self._restarts.launcher_event(kind, mono)
        if kind == "launcher_start" and (self._launcher_start is None or mono > self._launcher_start):
            self._launcher_start, self._max_restarts = mono, record.max_restarts
            self._launcher_ranks = record.local_world_size
            self._launcher_world = record.world_size
        elif kind == "launcher_exit" and (self._launcher_exit is None or mono > self._launcher_exit):
            self._launcher_exit = mono

    def _tearing_down(self, mono: float) -> bool:
        """Whether the launcher had detected a failure at ``mono`` and not started workers since:
        the workers that end then are the ones it stops, not faults (they stay in ``restart``)."""
        for at, kind in reversed(self._restarts.launcher):
            if at <= mono and kind in ("launcher_failure_detected", "launcher_worker_start"):
                return kind == "launcher_failure_detected"
        return False

    def _lane_ingest(self, lane: _Lane, ev: Event) -> None:
        mono = ev.mono  # comparisons by mono first: _ORDER's tuples are built only on a tie
        applied = lane.applied
        if applied is not None and (mono < applied.mono or mono == applied.mono and _ORDER(ev) < _ORDER(applied)):
            self._counts["late"] += 1
            return
        pending = lane.pending
        if pending:
            last = pending[-1]
            if mono < last.mono or mono == last.mono and _ORDER(ev) < _ORDER(last):
                insort(pending, ev, key=_ORDER)
                self._counts["out_of_order"] += 1
                return
        pending.append(ev)
        horizon = mono - self.window
        if pending[0].mono >= horizon:
            return
        ledger, sink, popleft = lane.ledger, self._restarts, pending.popleft
        while pending and pending[0].mono < horizon:
            ev = popleft()
            ledger.apply(ev, sink)
        lane.applied = ev

    def _live(self) -> dict[int, int]:
        return {rank: lane.newest_pid for rank, lane in self._lanes.items()}

    # --- snapshot ------------------------------------------------------------------------------
    def _launcher_remaining(self) -> int | None:
        """Restarts the newest launcher may still make: its ``--max-restarts`` minus the highest
        restart count its workers journaled (ranks whose newest record predates it ran under an
        older launcher, which counted from 0 too)."""
        if self._max_restarts is None or self._launcher_start is None:
            return None
        start = self._launcher_start
        done = max((lane.newest_restart for lane in self._lanes.values() if lane.newest >= start), default=0)
        return max(0, self._max_restarts - done)

    def _pod_ranks(self, finished: bool) -> int:
        """The ranks this pod runs: those its processes journaled, and while its launcher runs, the
        workers it said it starts (so a pod's ranks count from its launcher's start, as its wall does);
        none once it finished (its wall stopped: another pod still running leaves its ranks absent)."""
        if finished:
            return 0
        running = self._launcher_start is not None and not self._launcher_exited()
        return max(len(self._lanes), (self._launcher_ranks or 0) if running else 0)

    def _launcher_exited(self) -> bool:
        """Whether the pod's newest launcher has exited (none journaled: not exited)."""
        return self._launcher_exit is not None and self._launcher_exit >= (self._launcher_start or float("-inf"))

    def _finished(self) -> bool:
        """The pod's launcher exited after its last start, and every rank it ran ended cleanly.

        A pod decides from its own ranks: in a job of many pods it sees only its share of the
        world, and the launcher's exit says none of its workers is left. Its ranks' own
        ``local_world_size`` says how many there are, so a rank whose file is read after the
        launcher's exit still keeps the pod running. Without a journaled launcher a pod never
        counts as finished: a launcher read late could still show it running, and un-finishing
        would take settled seconds back.
        """
        if not self._launcher_exited():
            return False
        # Ranks of the launcher's last round of workers only: an earlier round's process may have
        # journaled as another rank before it was torn down (an in-process restart that shifted ranks)
        began = next((at for at, kind in reversed(self._restarts.launcher) if kind == "launcher_worker_start"),
                     float("-inf"))
        lanes = [lane for lane in self._lanes.values() if lane.newest >= began]
        return (len(lanes) >= max((lane.local_world_size for lane in lanes), default=1)
                and all(lane.newest_kind == "process_end" for lane in lanes))

    def snapshot(self, now_mono: float, now_wall: float) -> Snapshot:
        """Everything known at ``now_mono`` (the journal's monotonic clock, ideally a read horizon: see
        the module docstring). Changes nothing but the furthest instant shown, so wall never goes back."""
        finished = self._finished()
        restarts, ledgers = self._settled(finished)
        # every record read, applied on copies: what the reorder window has yet to settle as productive
        previews = ledgers if finished else self._settled(False, deciding=True)[1]
        origin = self._origin if self._origin is not None else now_mono
        end = max(self._newest, self._shown) if finished else max(now_mono, self._newest, self._shown)
        if self._lanes:
            self._shown = end
        live = self._live()
        skew = derived.skew_ratios({r: sum(lane.recent) / len(lane.recent)
                                    for r, lane in self._lanes.items() if lane.recent})
        ranks = tuple(self._rank(ledgers[r], previews[r], self._lanes[r], origin, end, finished, skew.get(r))
                      for r in ledgers)

        elapsed = end - origin
        mtbf = derived.mtbf(elapsed, restarts.faults())
        ck = self._checkpoints.view(finished, live)
        blocking_h, background_h = ck["blocking"], ck["background"]
        cost = blocking_h.sum / blocking_h.count if blocking_h.count else None
        both = blocking_h.sum + background_h.sum
        interval = ((ck["last_written"] - ck["first_written"]) / (ck["saves"] - 1)
                    if ck["saves"] >= 2 and ck["first_written"] is not None else None)
        wall = sum(r.wall_s for r in ranks)
        blocked = sum(r.seconds[SETTLED_CATEGORIES[BLOCKING]] for r in ranks)
        checkpoints = CheckpointStats(
            saves=ck["saves"], failures=ck["failures"], in_flight=ck["in_flight"], bytes_total=ck["bytes_total"],
            blocking=blocking_h.frozen(), background=background_h.frozen(),
            overlap_ratio=background_h.sum / both if both > 0 else None,
            blocking_fraction=blocked / wall if wall > 0 else None,
            last_success_wall=ck["last_wall"], last_success_step=ck["last_step"],
            age_s=None if ck["last_written"] is None else max(0.0, now_mono - ck["last_written"]),
            interval_s=interval, optimal_interval_s=derived.young_daly_interval(cost, mtbf), recent=ck["recent"])
        job, pod, node = self._identity
        return Snapshot(
            now_mono=now_mono, now_wall=now_wall, job=job, pod=pod, node=node, job_start_wall=self._origin_wall,
            finished=finished, ranks=ranks, checkpoints=checkpoints,
            restarts=restarts.stats(finished, mtbf, self._launcher_remaining()),
            predicted_efficiency=derived.ettr(interval, cost, restarts.mean_duration(), mtbf),
            events_accepted=self._accepted, duplicates=self._counts["duplicates"],
            out_of_order=self._counts["out_of_order"], late=self._counts["late"],
            implausible=self._counts["implausible"], records_lost=self._counts["records_lost"],
            journal_lag_s=None if self._origin is None else max(0.0, now_mono - self._newest),
            world_size=self._world_size or self._launcher_world, pod_ranks=self._pod_ranks(finished), absent_s=0.0)

    def _settled(self, finished: bool, *, deciding: bool = False) -> tuple[Restarts, dict[int, Ledger]]:
        """The restarts and ledgers by rank as of now; a finished job's buffers applied, on copies.
        ``deciding``: also the buffers holding a record that decides work (a save's end, a restore)."""
        restarts = self._restarts.copy() if finished or deciding else self._restarts
        ledgers: dict[int, Ledger] = {}
        for rank in sorted(self._lanes):
            lane = self._lanes[rank]
            ledger = lane.ledger
            if lane.pending and (finished or deciding and any(r.type in _DECIDING for r in lane.pending)):
                ledger = ledger.copy()
                for r in lane.pending:
                    ledger.apply(r, restarts)
            ledgers[rank] = ledger
        return restarts, ledgers

    def take_verdicts(self) -> dict[int, list[Verdict]]:
        """The step verdicts decided since the last call, by rank (``keep_history`` only). Once the
        job finished, those its settling decides are included in every call: applying a verdict
        to steps it already decided changes nothing."""
        if not self.keep_history:
            raise RuntimeError("take_verdicts needs Engine(keep_history=True)")
        _, ledgers = self._settled(self._finished())
        out: dict[int, list[Verdict]] = {}
        for rank, ledger in ledgers.items():
            out[rank] = ledger.verdicts or []
            self._lanes[rank].ledger.verdicts = []
        return out

    def history(self) -> History:
        """Every restart and save so far (``keep_history`` only)."""
        if not self.keep_history:
            raise RuntimeError("history needs Engine(keep_history=True)")
        finished = self._finished()
        restarts, _ = self._settled(finished)
        return History(tuple(restarts.records()), self._checkpoints.view(finished, self._live())["records"])

    @staticmethod
    def _rank(led: Ledger, preview: Ledger, lane: _Lane, origin: float, end: float, finished: bool,
              skew: float | None) -> RankSnapshot:
        seconds = [0.0] * len(SETTLED_CATEGORIES)
        unprotected = end - origin  # nothing applied yet: all provisional
        if led.first is not None:
            seconds = led.seconds[:]
            seconds[INIT] += led.first - origin
            tail = max(0.0, end - led.t)
            unprotected = led.pool_sum
            if finished:
                seconds[BLOCKING if led.blocking is not None else GAP[led.state]] += tail
            else:
                unprotected += tail
        idle = sum(seconds) - seconds[PRODUCTIVE] - seconds[LOST]
        kept = preview.seconds[PRODUCTIVE] - led.seconds[PRODUCTIVE]  # by saves read, not yet settled
        return RankSnapshot(
            rank=led.rank, wall_s=end - origin, seconds=dict(zip(SETTLED_CATEGORIES, seconds, strict=True)),
            unprotected_s=unprotected, at_risk_s=0.0 if finished else max(0.0, unprotected - kept),
            steps=lane.steps, step=lane.step, last_step_wall=lane.step_wall,
            step_duration=lane.hist.frozen(), worker_alive=lane.worker_alive(), skew_ratio=skew, gpu_idle_s=idle,
            state=led.state, pid=lane.newest_pid, restart=lane.newest_restart, iter=lane.newest_iter,
            last_restore_wall=lane.last_restore_wall, user_spans=dict(led.user), first_step_wall=lane.first_step_wall)

    # --- state ---------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """A JSON-safe copy of the engine's state (strict JSON: no NaN or infinities)."""
        return {
            "version": STATE_VERSION,
            "window": self.window,
            "lanes": {str(rank): _lane_state(lane) for rank, lane in self._lanes.items()},
            "lane_of_local": {str(local): rank for local, rank in self._lane_of.local().items()},
            "restarts": self._restarts.to_state(),
            "checkpoints": self._checkpoints.to_state(),
            "seen": {str(pid): seqs.to_state() for pid, seqs in self._seen.items()},
            "pid_first": {str(pid): first for pid, first in self._pid_first.items()},
            "pid_started": sorted(self._started),
            "pid_end": {str(pid): end for pid, end in self._pid_end.items()},
            "origin": [self._origin, self._origin_wall],
            "newest": _finite(self._newest),
            "launcher": [self._launcher_start, self._launcher_exit],
            "max_restarts": self._max_restarts,
            "launcher_ranks": [self._launcher_ranks, self._launcher_world],
            "world_size": self._world_size,
            "identity": list(self._identity),
            "counts": {"accepted": self._accepted, **self._counts},
            "next_fold": _finite(self._next_fold),
            "shown": _finite(self._shown),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Engine:
        """The engine ``to_state`` saved; raises ``ValueError`` if the state is not one."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not an engine state of version {STATE_VERSION}")
        try:
            engine = cls(float(state["window"]))
            engine._lanes = {int(rank): _lane_from_state(int(rank), lane) for rank, lane in state["lanes"].items()}
            runs = sorted((first, pid, rank) for rank, ln in engine._lanes.items() for pid, first in ln.pids.items())
            engine._lane_of = ProcessLanes({pid: rank for _, pid, rank in reversed(runs)},  # its oldest lane wins
                                           {int(local): int(rank) for local, rank in state["lane_of_local"].items()})
            engine._restarts = Restarts.from_state(state["restarts"])
            engine._checkpoints = Checkpoints.from_state(engine.window, state["checkpoints"])
            engine._seen = {int(pid): Seqs.from_state(seqs) for pid, seqs in state["seen"].items()}
            engine._pid_first = {int(pid): float(first) for pid, first in state["pid_first"].items()}
            engine._started = set(msgspec.convert(state["pid_started"], list[int]))
            engine._pid_end = {int(pid): float(end) for pid, end in state["pid_end"].items()}
            engine._origin, engine._origin_wall = msgspec.convert(state["origin"], tuple[float | None, float | None])
            engine._newest = _infinite(state["newest"])
            engine._launcher_start, engine._launcher_exit = msgspec.convert(state["launcher"],
                                                                            tuple[float | None, float | None])
            engine._max_restarts = msgspec.convert(state["max_restarts"], int | None)
            engine._launcher_ranks, engine._launcher_world = msgspec.convert(state["launcher_ranks"],
                                                                             tuple[int | None, int | None])
            engine._world_size = msgspec.convert(state["world_size"], int | None)
            job, pod, node = state["identity"]
            engine._identity = (str(job), str(pod), str(node))
            engine._counts = {k: int(state["counts"][k]) for k in engine._counts}
            engine._accepted = int(state["counts"]["accepted"])
            engine._next_fold = _infinite(state["next_fold"])
            engine._shown = _infinite(state["shown"])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise ValueError(f"not an engine state: {exc!r}") from None
        return engine


def _finite(value: float) -> float | None:
    return None if value == float("-inf") else value


def _infinite(value: float | None) -> float:
    return float("-inf") if value is None else float(value)


# A lane's plain fields and their types, which loading a state checks (msgspec.convert).
_LANE_FIELDS: dict[str, Any] = {
    "newest_pid": int, "newest_kind": str, "newest_restart": int, "newest_iter": int, "steps": int,
    "step": int | None, "step_wall": float | None, "worker": bool | None, "worker_pid": int,
    "local_world_size": int, "first_step_wall": float | None,
    "last_restore_wall": float | None}


def _lane_state(lane: _Lane) -> dict[str, Any]:
    out = {name: getattr(lane, name) for name in _LANE_FIELDS}
    out.update(pids={str(pid): first for pid, first in lane.pids.items()}, ledger=lane.ledger.to_state(),
               pending=[msgspec.to_builtins(ev) for ev in lane.pending],
               newest=_finite(lane.newest), step_mono=_finite(lane.step_mono), worker_mono=_finite(lane.worker_mono),
               applied=None if lane.applied is None else msgspec.to_builtins(lane.applied), hist=lane.hist.to_state(),
               recent=list(lane.recent))
    return out


def _lane_from_state(rank: int, state: dict[str, Any]) -> _Lane:
    lane = _Lane(rank)
    for name, kind in _LANE_FIELDS.items():
        setattr(lane, name, msgspec.convert(state[name], kind))
    lane.ledger = Ledger.from_state(state["ledger"])
    lane.pids = {int(pid): float(first) for pid, first in state["pids"].items()}
    lane.pending = deque(sorted(map(as_event, state["pending"]), key=_ORDER))
    lane.newest, lane.step_mono, lane.worker_mono = (_infinite(state[k]) for k in ("newest", "step_mono",
                                                                                   "worker_mono"))
    lane.applied = None if state["applied"] is None else as_event(state["applied"])
    lane.hist = Buckets.from_state(STEP_BUCKETS, state["hist"])
    lane.recent = deque(msgspec.convert(state["recent"], list[float]), maxlen=RECENT_STEPS)
    return lane
