"""Pod-level checkpoint aggregates, built from each rank's checkpoint_* events in any order.

Every rank journals its part of a save (see ``trainer/checkpoint.py``). Per rank and save: blocking
= ``checkpoint_start`` → ``checkpoint_scheduled`` plus its ``checkpoint_finalize`` spans and the
loop's later waits on it (its end's ``waited_s``); background = ``scheduled`` → ``written`` (the
instant the writer finished). The histograms take one observation per rank per save. A save
(checkpoint id) is durable when every rank that started it ended ok, failed when any rank's end is
not ok, and abandoned for a rank whose process died before its end. Each quantity is a pure
function of the events seen, so the order they arrive in does not matter. Each record is stored
under its own incarnation; a process's part without a start (an async save's end written after an
in-process restart) is read as part of the newest save of that id the process started at or before
its iteration (``_grouped``). A save enters the histograms, ``saves`` and ``bytes_total`` once
nothing can join it any more (see ``Checkpoints.fold``) or the job finished.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable
from typing import Any

from nvrx_slo.contracts.catalogue import CHECKPOINT_BUCKETS
from nvrx_slo.exporter.engine.histogram import Buckets
from nvrx_slo.exporter.engine.snapshot import CheckpointRecord
from nvrx_slo.exporter.ingest.decode import Event

RECENT = 32
MAX_OPEN = 64  # saves waiting for ranks that never report are closed, oldest first, beyond this

# one process's part of a save, keyed (rank, pid):
# [pid, start, step, mode, scheduled, bytes, finalize_s (finalize spans and waits), end, written, written_wall, ok,
#  newest record's mono, start_wall]
PID, START, STEP, MODE, SCHED, BYTES, FINALIZE, END, WRITTEN, WRITTEN_WALL, OK, LAST, START_WALL = range(13)


def _part() -> list[Any]:
    return [None, None, None, "", None, 0, 0.0, None, None, None, None, float("-inf"), None]


def _began(parts: dict[tuple[int, int], list[Any]]) -> float:
    return min(p[START] if p[START] is not None else p[LAST] for p in parts.values())


def _one(rec: Event) -> list[Any]:
    """The part one checkpoint_* record makes on its own."""
    part = _part()
    part[PID], part[LAST] = rec.pid, rec.mono
    kind, mono = rec.type, rec.mono
    if kind == "checkpoint_start":
        part[START], part[START_WALL], part[STEP], part[MODE] = mono, rec.wall, rec.step, rec.mode
    elif kind == "checkpoint_scheduled":
        part[SCHED], part[BYTES] = mono, rec.bytes
    elif kind == "checkpoint_finalize":
        part[FINALIZE] = max(0.0, mono - rec.start)
    else:  # checkpoint_end
        part[OK], part[STEP], part[END], part[WRITTEN] = rec.ok, rec.step, mono, rec.written
        part[FINALIZE] = rec.waited_s or 0.0
        part[WRITTEN_WALL] = rec.wall - (mono - rec.written)
    return part


def _merged(a: list[Any], b: list[Any]) -> list[Any]:
    """Two parts of one process's save as one (a new list): earliest start, latest end, one failure
    fails the part, finalize spans summed."""
    out = list(a)
    if b[START] is not None and (out[START] is None or b[START] < out[START]):
        out[START], out[START_WALL] = b[START], b[START_WALL]
    out[STEP] = max((p[STEP] for p in (a, b) if p[STEP] is not None), default=None)
    out[MODE] = a[MODE] or b[MODE]
    out[SCHED] = max((p[SCHED] for p in (a, b) if p[SCHED] is not None), default=None)
    out[BYTES] = max(a[BYTES], b[BYTES])
    out[FINALIZE] = a[FINALIZE] + b[FINALIZE]
    if b[END] is not None and (out[END] is None or b[END] > out[END]):
        out[END], out[WRITTEN], out[WRITTEN_WALL] = b[END], b[WRITTEN], b[WRITTEN_WALL]
    out[OK] = b[OK] if a[OK] is None else (a[OK] if b[OK] is None else a[OK] and b[OK])
    out[LAST] = max(a[LAST], b[LAST])
    return out


def _record(fields: list[Any]) -> CheckpointRecord:
    """A ``CheckpointRecord`` from its state (a JSON list: the incarnation is a list there)."""
    ckpt, step, mode, blocking_s, background_s, ok, nbytes, written_wall, ranks, (restart, iter_), began = fields
    return CheckpointRecord(ckpt, step, mode, blocking_s, background_s, ok, nbytes, written_wall, ranks,
                            (restart, iter_), began)


def _key(text: str) -> tuple[int, int]:
    rank, pid = text.split("/")
    return int(rank), int(pid)


class Checkpoints:
    def __init__(self, window: float, keep: int | None = RECENT) -> None:
        """``keep``: folded saves kept as records (None: all, for an offline replay)."""
        self.window = window
        self.keep = keep
        # "<restart>/<iter>/<ckpt id>" -> (rank, pid) -> part. A restarted job may save an id
        # again after a rollback: the restart count and Wrapper iteration tell the saves apart.
        self.open: dict[str, dict[tuple[int, int], list[Any]]] = {}
        self.blocking = Buckets(CHECKPOINT_BUCKETS)
        self.background = Buckets(CHECKPOINT_BUCKETS)
        self.saves = 0
        self.failures = 0
        self.bytes_total = 0
        self.last_written: float | None = None  # mono of the newest durable save
        self.last_wall: float | None = None
        self.last_step: int | None = None
        self.first_written: float | None = None
        self.recent: list[tuple[float, str, CheckpointRecord]] = []  # (began, key, record), oldest first
        self.due = float("inf")  # no save can fold before the pod's newest record reaches this

    def add(self, rec: Event, rank: int) -> bool:
        """One checkpoint_* event of rank ``rank`` (checkpoint_worker is the ledger's). Returns whether
        it gave its start to a part read without one: that part leaves the earlier save ``_grouped``
        had joined it to, which may be over now (``fold`` again)."""
        ckpt = f"{rec.restart}/{rec.iter}/{rec.ckpt}"
        parts = self.open.get(ckpt)
        if parts is None:
            parts = self.open[ckpt] = {}
            if len(self.open) > MAX_OPEN:
                oldest = min(self.open, key=lambda k: (_began(self.open[k]) if self.open[k] else float("inf"), k))
                self._close(oldest, self.open.pop(oldest), {})
        key = (rank, rec.pid)  # a restarted process may save the same id again
        # Parts combine commutatively (``_merged``), so arrival order cannot matter; a process that
        # saves one id twice in one iteration (a retry) gets one part for both.
        part = _one(rec)
        startless = key in parts and parts[key][START] is None
        parts[key] = _merged(parts[key], part) if key in parts else part
        self.due = min(self.due, parts[key][LAST] + self.window)
        return startless and part[START] is not None

    def _grouped(self) -> tuple[dict[str, dict[tuple[int, int], list[Any]]], dict[str, list[tuple[str, Any]]]]:
        """The open saves as read: a process's part without a start joins the newest save of that id
        the process started at or before the part's iteration (the same restart), in whatever order
        the records came. Also, per save read, the stored (key, part key) pairs it is made of.
        Nearly always every part has its start, and the stored saves are the saves read."""
        homes: dict[tuple[str, str, int, int], list[int]] = {}  # (restart, ckpt, rank, pid) -> started iters
        startless = False
        for key, parts in self.open.items():
            restart, iter_, ckpt = key.split("/", 2)
            for (rank, pid), part in parts.items():
                if part[START] is None:
                    startless = True
                else:
                    homes.setdefault((restart, ckpt, rank, pid), []).append(int(iter_))
        if not startless:
            return self.open, {key: [(key, k) for k in parts] for key, parts in self.open.items()}
        grouped: dict[str, dict[tuple[int, int], list[Any]]] = {}
        members: dict[str, list[tuple[str, Any]]] = {}
        for key, parts in self.open.items():
            restart, iter_, ckpt = key.split("/", 2)
            for (rank, pid), part in parts.items():
                home = key
                if part[START] is None:
                    earlier = [i for i in homes.get((restart, ckpt, rank, pid), ()) if i <= int(iter_)]
                    if earlier:
                        home = f"{restart}/{max(earlier)}/{ckpt}"
                group = grouped.setdefault(home, {})
                group[(rank, pid)] = _merged(group[(rank, pid)], part) if (rank, pid) in group else part
                members.setdefault(home, []).append((key, (rank, pid)))
        return grouped, members

    @staticmethod
    def _blocking(part: list[Any]) -> float | None:
        if part[START] is None or part[SCHED] is None:
            return None
        return max(0.0, part[SCHED] - part[START]) + part[FINALIZE]

    @staticmethod
    def _background(part: list[Any]) -> float | None:
        if not part[OK] or part[SCHED] is None or part[WRITTEN] is None:
            return None
        return max(0.0, part[WRITTEN] - part[SCHED])

    def record(self, key: str, parts: dict[tuple[int, int], list[Any]], live: dict[int, int]) -> CheckpointRecord:
        ends = [p for p in parts.values() if p[END] is not None]
        failed = any(p[OK] is False for p in ends)
        pending = any(p[END] is None and live.get(r) == pid for (r, pid), p in parts.items())
        blocking = [b for b in map(self._blocking, parts.values()) if b is not None]
        background = [b for b in map(self._background, parts.values()) if b is not None]
        walls = [p[WRITTEN_WALL] for p in ends if p[OK]]
        steps = [p[STEP] for p in parts.values() if p[STEP] is not None]
        modes = [p[MODE] for p in parts.values() if p[MODE]]
        began = [p[START_WALL] for p in parts.values() if p[START_WALL] is not None]
        restart, iter_, ckpt = key.split("/", 2)
        return CheckpointRecord(
            ckpt=ckpt, incarnation=(int(restart), int(iter_)), began_wall=min(began) if began else None,
            step=max(steps) if steps else -1, mode=modes[0] if modes else "",
            blocking_s=max(blocking) if blocking else None, background_s=max(background) if background else None,
            ok=False if failed else (None if pending or not ends else True),
            bytes=sum(p[BYTES] for p in parts.values()), written_wall=max(walls) if walls else None,
            ranks=sum(1 for p in parts.values() if p[START] is not None))

    def _done(self, parts: dict[tuple[int, int], list[Any]], live: dict[int, int]) -> bool:
        return all(p[END] is not None or live.get(r) != pid for (r, pid), p in parts.items())

    def _fold_one(self, key: str, parts: dict[tuple[int, int], list[Any]], live: dict[int, int],
                  blocking: Buckets, background: Buckets) -> tuple[CheckpointRecord, bool]:
        record = self.record(key, parts, live)
        for part in parts.values():
            b = self._blocking(part)
            if b is not None:
                blocking.observe(b)
            g = self._background(part)
            if g is not None:
                background.observe(g)
        return record, record.ok is True

    def fold(self, newest: float, live: dict[int, int], pid_at: Callable[[int, float], int | None]) -> None:
        """Move saves into the history once nothing can join them any more: every part is done,
        the newest record in the pod is ``window`` past the save's newest record, and every rank
        without a part was not running, at the save's start, the process it runs now
        (``pid_at(rank, mono)``: the rank's process at that instant).

        Call it before adding a record whenever ``newest >= due`` (and after a rank's process
        changed), so that a later save of the same id never joins one that is over."""
        due = float("inf")
        grouped, members = self._grouped()
        for ckpt, parts in list(grouped.items()):
            last = max(p[LAST] for p in parts.values()) + self.window
            if last > newest:
                due = min(due, last)
                continue
            if not self._done(parts, live):
                continue  # re-armed by its next record or a process change
            ranks = {rank for rank, _ in parts}
            begun = _began(parts)
            if any(rank not in ranks and pid_at(rank, begun) == pid for rank, pid in live.items()):
                continue
            parts = dict(parts)  # the stored dict itself when nothing was regrouped
            for key, part_key in members[ckpt]:
                del self.open[key][part_key]
                if not self.open[key]:
                    del self.open[key]
            self._close(ckpt, parts, live)
        self.due = due

    def _close(self, ckpt: str, parts: dict[tuple[int, int], list[Any]], live: dict[int, int]) -> None:
        record, durable = self._fold_one(ckpt, parts, live, self.blocking, self.background)
        if record.ok is False:
            self.failures += 1
        if durable:
            written = max(p[WRITTEN] for p in parts.values() if p[OK])
            self.saves += 1
            self.bytes_total += record.bytes
            self.first_written = written if self.first_written is None else min(self.first_written, written)
            if self.last_written is None or written > self.last_written:
                self.last_written, self.last_wall, self.last_step = written, record.written_wall, record.step
        insort(self.recent, (_began(parts), ckpt, record), key=lambda x: x[:2])
        if self.keep is not None:
            del self.recent[:-self.keep]

    def view(self, finished: bool, live: dict[int, int]) -> dict[str, Any]:
        """The aggregates as of now: folded history plus open saves (histograms only if ``finished``)."""
        blocking, background = self.blocking, self.background
        saves, bytes_total, failures = self.saves, self.bytes_total, self.failures
        last = (self.last_written, self.last_wall, self.last_step)
        first = self.first_written
        in_flight = 0
        open_records = []
        if finished:
            blocking, background = blocking.copy(), background.copy()
        grouped, members = self._grouped()
        for key, parts in grouped.items():
            done = self._done(parts, live)
            if finished and done:
                record, durable = self._fold_one(key, parts, live, blocking, background)
                if durable:
                    saves += 1
                    bytes_total += record.bytes
            else:
                record, durable = self.record(key, parts, live), False
            open_records.append((_began(parts), key, record))
            # a part read without its start may yet move to another save (``_grouped``): an open
            # save's failure counts once a stored part that has its start failed, which stays put,
            # so the counter never goes down when a part moves
            failures += any(self.open[k][part][START] is not None and self.open[k][part][OK] is False
                            for k, part in members[key])
            in_flight += record.ok is None and any(p[END] is None and live.get(r) == pid for (r, pid),
                                                   p in parts.items())
            if record.ok is True:
                written = max(p[WRITTEN] for p in parts.values() if p[OK])
                if durable:
                    first = written if first is None else min(first, written)
                if last[0] is None or written > last[0]:
                    last = (written, record.written_wall, record.step)
        recent = [r for _, _, r in sorted(self.recent + open_records, key=lambda x: x[:2])]
        return {"blocking": blocking, "background": background, "saves": saves, "failures": failures,
                "bytes_total": bytes_total, "in_flight": in_flight, "last_written": last[0],
                "last_wall": last[1], "last_step": last[2], "first_written": first,
                "recent": tuple(recent[-RECENT:]), "records": tuple(recent)}

    # --- state ---------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        return {
            "open": {ckpt: {f"{r}/{pid}": p for (r, pid), p in parts.items()} for ckpt, parts in self.open.items()},
            "blocking": self.blocking.to_state(), "background": self.background.to_state(),
            "saves": self.saves, "failures": self.failures, "bytes_total": self.bytes_total,
            "last": [self.last_written, self.last_wall, self.last_step], "first_written": self.first_written,
            "due": None if self.due == float("inf") else self.due,
            "recent": [[began, key, [r.ckpt, r.step, r.mode, r.blocking_s, r.background_s, r.ok, r.bytes,
                                     r.written_wall, r.ranks, list(r.incarnation), r.began_wall]]
                       for began, key, r in self.recent],
        }

    @classmethod
    def from_state(cls, window: float, state: dict[str, Any]) -> Checkpoints:
        out = cls(window)
        out.open = {ckpt: {_key(k): list(p) for k, p in parts.items()} for ckpt, parts in state["open"].items()}
        out.blocking = Buckets.from_state(CHECKPOINT_BUCKETS, state["blocking"])
        out.background = Buckets.from_state(CHECKPOINT_BUCKETS, state["background"])
        out.saves, out.failures = int(state["saves"]), int(state["failures"])
        out.bytes_total = int(state["bytes_total"])
        out.last_written, out.last_wall, out.last_step = state["last"]
        out.first_written = state["first_written"]
        out.due = float("inf") if state["due"] is None else float(state["due"])
        out.recent = [(float(began), str(key), _record(r)) for began, key, r in state["recent"]]
        return out
