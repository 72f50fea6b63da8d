"""The time-accounting engine: journal events in, a ``Snapshot`` out. Pure: no I/O, no threads,
no globals, no clock reads — the caller passes the clock to ``snapshot``.

Usage (one engine per pod journal)::

    engine = Engine()
    for record in validated_records:          # trainer.schema.validate()d dicts, any order
        engine.ingest(record)
    snap = engine.snapshot(time.monotonic(), time.time())
    state = engine.to_state()                 # JSON-safe; persist it with the reader's offsets
    engine = Engine.from_state(state)         # resume after a crash: nothing lost or counted twice

Arrival order: records may arrive in any order within ``reorder_window_s`` of monotonic time per
rank (files read round-robin, threads writing slightly out of order); they are accounted exactly
as if they had arrived sorted. A record older than that, relative to the newest record of its
rank, is counted in ``Snapshot.late`` and left out of the rank's time accounting, because the
time it would change is already settled in counters that must never go down. A reader that
catches up on a backlog must therefore feed each rank's files oldest first (merging by ``mono``
is best). Duplicates by (pid, seq) are counted and ignored. See docs/accounting.md for the model.

How: each rank keeps its not-yet-settled records sorted in a buffer; a record is applied to the
rank's ``Ledger`` once the rank's newest record is ``reorder_window_s`` past it. ``snapshot``
replays the buffers on copies, so it sees every record and changes nothing.
"""

from __future__ import annotations

from bisect import insort
from typing import Any

from exporter import derived
from exporter.accounting import _GAP, BLOCKING, INIT, LOST, PRODUCTIVE, Ledger
from exporter.catalogue import SETTLED_CATEGORIES
from exporter.checkpoints import Checkpoints
from exporter.restarts import Restarts
from exporter.snapshot import CheckpointStats, RankSnapshot, RankState, Snapshot

__all__ = ["Engine", "Snapshot", "REORDER_WINDOW_S"]

REORDER_WINDOW_S = 10.0
STATE_VERSION = 1
FOLD_EVERY_S = 1.0  # how often (journal time) finished saves and restarts move into the histograms
DEDUPE_AHEAD = 1024  # out-of-order seqs remembered per pid before a gap is taken as rotated away
_CHECKPOINT_EVENTS = {"checkpoint_start", "checkpoint_scheduled", "checkpoint_finalize", "checkpoint_end"}


class _Lane:
    """One rank: its ledger and its buffer of records not yet applied, sorted by (mono, pid, seq)."""

    __slots__ = ("ledger", "pending", "head", "newest", "newest_pid", "applied")

    def __init__(self, rank: int) -> None:
        self.ledger = Ledger(rank)
        self.pending: list[tuple[tuple[float, int, int], dict[str, Any]]] = []
        self.head = 0  # pending[:head] are applied
        self.newest = float("-inf")
        self.newest_pid = -1
        self.applied: tuple[float, int, int] | None = None  # key of the last applied record


class Engine:
    """Accounts one pod's journal. ``ingest`` costs a few µs per step event."""

    def __init__(self, reorder_window_s: float = REORDER_WINDOW_S) -> None:
        if reorder_window_s < 0:
            raise ValueError(f"reorder_window_s must be >= 0, got {reorder_window_s}")
        self.window = reorder_window_s
        self._lanes: dict[int, _Lane] = {}
        self._restarts = Restarts()
        self._checkpoints = Checkpoints()
        self._seen: dict[int, list[Any]] = {}  # pid -> [next seq not seen, set of seqs seen ahead of it]
        self._origin: float | None = None
        self._origin_wall: float | None = None
        self._newest = float("-inf")
        self._launcher_start: float | None = None
        self._launcher_exit: float | None = None
        self._identity = ("", "", "")
        self._counts = {"accepted": 0, "duplicates": 0, "out_of_order": 0, "late": 0}
        self._next_fold = float("-inf")

    # --- ingest --------------------------------------------------------------------------------
    def _duplicate(self, pid: int, seq: int) -> bool:
        seen = self._seen.get(pid)
        if seen is None:
            seen = self._seen[pid] = [0, set()]
        nxt, ahead = seen
        if seq < nxt or seq in ahead:
            return True
        if seq == nxt:
            nxt += 1
            while nxt in ahead:
                ahead.discard(nxt)
                nxt += 1
            seen[0] = nxt
        else:
            ahead.add(seq)
            if len(ahead) > DEDUPE_AHEAD:  # the seqs in between were rotated away unread
                nxt = min(ahead)
                while nxt in ahead:
                    ahead.discard(nxt)
                    nxt += 1
                seen[0] = nxt
        return False

    def ingest(self, record: dict[str, Any]) -> None:
        """Account one validated journal record (``trainer.schema.validate``)."""
        pid: int = record["pid"]
        seq: int = record["seq"]
        if self._duplicate(pid, seq):
            self._counts["duplicates"] += 1
            return
        mono: float = record["mono"]
        kind: str = record["type"]
        rank: int | None = record["rank"]
        begin = record.get("start", mono) if kind in ("step", "restore", "checkpoint_finalize") else mono
        if self._origin is None or begin < self._origin:
            self._origin, self._origin_wall = begin, record["wall"] - (mono - begin)
            if not self._identity[1]:
                self._identity = (record["job"], record["pod"], record["node"])
        if mono > self._newest:
            self._newest = mono
        self._counts["accepted"] += 1
        if rank is None:
            self._launcher(kind, mono)
        else:
            if kind in _CHECKPOINT_EVENTS:
                self._checkpoints.add(record)
            self._lane_ingest(rank, record, (mono, pid, seq))
        if self._newest >= self._next_fold:
            self._fold()

    def _launcher(self, kind: str, mono: float) -> None:
        self._restarts.launcher_event(kind, mono)
        if kind == "launcher_start" and (self._launcher_start is None or mono > self._launcher_start):
            self._launcher_start = mono
        elif kind == "launcher_exit" and (self._launcher_exit is None or mono > self._launcher_exit):
            self._launcher_exit = mono

    def _lane_ingest(self, rank: int, record: dict[str, Any], key: tuple[float, int, int]) -> None:
        lane = self._lanes.get(rank)
        if lane is None:
            lane = self._lanes[rank] = _Lane(rank)
        if lane.applied is not None and key < lane.applied:
            self._counts["late"] += 1
            return
        pending = lane.pending
        if pending and key < pending[-1][0]:
            insort(pending, (key, record), lo=lane.head)
            self._counts["out_of_order"] += 1
        else:
            pending.append((key, record))
        mono = key[0]
        if mono <= lane.newest:
            return
        lane.newest, lane.newest_pid = mono, key[1]
        horizon = mono - self.window
        head = lane.head
        if pending[head][0][0] >= horizon:
            return
        ledger, sink, n = lane.ledger, self._restarts, len(pending)
        while head < n and pending[head][0][0] < horizon:
            ledger.apply(pending[head][1], sink)
            head += 1
        lane.applied = pending[head - 1][0]
        if head > 256 and head * 2 > n:
            del pending[:head]
            head = 0
        lane.head = head

    def _live(self) -> dict[int, int]:
        return {rank: lane.newest_pid for rank, lane in self._lanes.items()}

    def _fold(self) -> None:
        self._restarts.fold(self._newest, self.window)
        self._checkpoints.fold(self._newest, self.window, self._live())
        self._next_fold = self._newest + FOLD_EVERY_S

    # --- snapshot ------------------------------------------------------------------------------
    def _finished(self, ledgers: dict[int, Ledger]) -> bool:
        if not ledgers or any(led.state is not RankState.ENDED for led in ledgers.values()):
            return False
        if self._launcher_start is not None or self._launcher_exit is not None:
            return self._launcher_exit is not None and (
                self._launcher_start is None or self._launcher_exit > self._launcher_start)
        world = max((led.world_size or 0) for led in ledgers.values())
        return len(ledgers) >= world

    def snapshot(self, now_mono: float, now_wall: float) -> Snapshot:
        """Everything known at ``now_mono`` (the journal's monotonic clock); does not change the engine."""
        restarts = self._restarts.copy()
        ledgers: dict[int, Ledger] = {}
        for rank in sorted(self._lanes):
            lane = self._lanes[rank]
            ledger = lane.ledger
            if lane.head < len(lane.pending):
                ledger = ledger.copy()
                for _, record in lane.pending[lane.head:]:
                    ledger.apply(record, restarts)
            ledgers[rank] = ledger
        finished = self._finished(ledgers)
        origin = self._origin if self._origin is not None else now_mono
        end = self._newest if finished else max(now_mono, self._newest)
        live = {rank: led.pid for rank, led in ledgers.items()}
        skew = derived.skew_ratios({r: sum(led.recent) / len(led.recent) for r, led in ledgers.items() if led.recent})
        ranks = tuple(self._rank(led, origin, end, finished, skew.get(r)) for r, led in ledgers.items())

        elapsed = end - origin if self._origin is not None else 0.0
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
            finished=finished, ranks=ranks, checkpoints=checkpoints, restarts=restarts.stats(finished, mtbf),
            predicted_efficiency=derived.ettr(interval, cost, restarts.mean_duration(), mtbf),
            events_accepted=self._counts["accepted"], duplicates=self._counts["duplicates"],
            out_of_order=self._counts["out_of_order"], late=self._counts["late"],
            journal_lag_s=None if self._origin is None else max(0.0, now_mono - self._newest))

    @staticmethod
    def _rank(led: Ledger, origin: float, end: float, finished: bool, skew: float | None) -> RankSnapshot:
        seconds = led.seconds[:]
        seconds[INIT] += max(0.0, (led.first if led.first is not None else end) - origin)
        tail = max(0.0, end - led.t)
        unprotected = led.pool_sum
        if finished:
            seconds[BLOCKING if led.blocking is not None else _GAP[led.state]] += tail
        else:
            unprotected += tail
        idle = sum(seconds) - seconds[PRODUCTIVE] - seconds[LOST]
        return RankSnapshot(
            rank=led.rank, wall_s=end - origin, seconds=dict(zip(SETTLED_CATEGORIES, seconds)),
            unprotected_s=unprotected, steps=led.steps, step=led.step, last_step_wall=led.last_step_wall,
            step_duration=led.hist.frozen(), worker_alive=led.worker, skew_ratio=skew, gpu_idle_s=idle,
            state=led.state, pid=led.pid, restart=led.restart, iter=led.iter)

    # --- state ---------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """A JSON-safe copy of the engine's state."""
        return {
            "version": STATE_VERSION,
            "window": self.window,
            "lanes": {str(rank): {"ledger": lane.ledger.to_state(),
                                  "pending": [record for _, record in lane.pending[lane.head:]],
                                  "newest": lane.newest if lane.pending or lane.applied else None,
                                  "newest_pid": lane.newest_pid,
                                  "applied": None if lane.applied is None else list(lane.applied)}
                      for rank, lane in self._lanes.items()},
            "restarts": self._restarts.to_state(),
            "checkpoints": self._checkpoints.to_state(),
            "seen": {str(pid): [nxt, sorted(ahead)] for pid, (nxt, ahead) in self._seen.items()},
            "origin": [self._origin, self._origin_wall],
            "newest": self._newest if self._origin is not None else None,
            "launcher": [self._launcher_start, self._launcher_exit],
            "identity": list(self._identity),
            "counts": dict(self._counts),
            "next_fold": self._next_fold if self._next_fold > float("-inf") else None,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Engine:
        """The engine ``to_state`` saved; raises ``ValueError`` if the state is not one."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not an engine state of version {STATE_VERSION}")
        try:
            engine = cls(float(state["window"]))
            for rank, lane_state in state["lanes"].items():
                lane = engine._lanes[int(rank)] = _Lane(int(rank))
                lane.ledger = Ledger.from_state(lane_state["ledger"])
                lane.pending = sorted(((r["mono"], r["pid"], r["seq"]), r) for r in lane_state["pending"])
                newest = lane_state["newest"]
                lane.newest = float("-inf") if newest is None else float(newest)
                lane.newest_pid = int(lane_state["newest_pid"])
                applied = lane_state["applied"]
                lane.applied = None if applied is None else (applied[0], applied[1], applied[2])
            engine._restarts = Restarts.from_state(state["restarts"])
            engine._checkpoints = Checkpoints.from_state(state["checkpoints"])
            engine._seen = {int(pid): [int(nxt), set(ahead)] for pid, (nxt, ahead) in state["seen"].items()}
            engine._origin, engine._origin_wall = state["origin"]
            newest = state["newest"]
            engine._newest = float("-inf") if newest is None else float(newest)
            engine._launcher_start, engine._launcher_exit = state["launcher"]
            engine._identity = tuple(state["identity"])  # type: ignore[assignment]
            engine._counts = {k: int(state["counts"][k]) for k in engine._counts}
            next_fold = state["next_fold"]
            engine._next_fold = float("-inf") if next_fold is None else float(next_fold)
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"not an engine state: {exc!r}") from None
        return engine
