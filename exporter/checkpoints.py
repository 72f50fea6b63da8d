"""Pod-level checkpoint aggregates, built from each rank's checkpoint_* events in any order.

Every rank journals its part of a save (see ``trainer/checkpoint.py``). Per rank and save:
blocking = ``checkpoint_start`` → ``checkpoint_scheduled`` plus its ``checkpoint_finalize``
spans; background = ``scheduled`` → ``written`` (the instant the writer finished). The
histograms take one observation per rank per save. A save (checkpoint id) is durable when every
rank that started it ended ok, failed when any rank's end is not ok, and abandoned for a rank
whose process died before its end. Each quantity is a pure function of the events seen, so the
order they arrive in does not matter; a save enters the histograms, ``saves`` and
``bytes_total`` once all its ranks are done and the newest event in the pod is ``window``
seconds past its last end (or the job finished).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from exporter.catalogue import CHECKPOINT_BUCKETS
from exporter.histogram import Buckets
from exporter.snapshot import CheckpointRecord

RECENT = 32

# one process's part of a save, keyed (rank, pid): [pid, start, step, mode, scheduled, bytes, finalize_s, end, written, written_wall, ok]
PID, START, STEP, MODE, SCHED, BYTES, FINALIZE, END, WRITTEN, WRITTEN_WALL, OK = range(11)


def _part() -> list[Any]:
    return [None, None, None, "", None, 0, 0.0, None, None, None, None]


def _key(text: str) -> tuple[int, int]:
    rank, pid = text.split("/")
    return int(rank), int(pid)


class Checkpoints:
    def __init__(self) -> None:
        self.open: dict[str, dict[tuple[int, int], list[Any]]] = {}  # ckpt id -> rank -> part
        self.blocking = Buckets(CHECKPOINT_BUCKETS)
        self.background = Buckets(CHECKPOINT_BUCKETS)
        self.saves = 0
        self.failures = 0
        self.bytes_total = 0
        self.last_written: float | None = None  # mono of the newest durable save
        self.last_wall: float | None = None
        self.last_step: int | None = None
        self.first_written: float | None = None
        self.recent: deque[CheckpointRecord] = deque(maxlen=RECENT)
        self.ended_since_fold = False

    def add(self, rec: dict[str, Any]) -> None:
        """One checkpoint_* event of a rank (checkpoint_worker is the ledger's)."""
        parts = self.open.setdefault(rec["ckpt"], {})
        key = (rec["rank"], rec["pid"])  # a restarted process may save the same id again
        part = parts.get(key)
        if part is None:
            part = parts[key] = _part()
            part[PID] = rec["pid"]
        kind = rec["type"]
        if kind == "checkpoint_start":
            part[START], part[STEP], part[MODE] = rec["mono"], rec["step"], rec["mode"]
        elif kind == "checkpoint_scheduled":
            part[SCHED], part[BYTES] = rec["mono"], rec["bytes"]
        elif kind == "checkpoint_finalize":
            part[FINALIZE] += max(0.0, rec["mono"] - rec["start"])
        else:  # checkpoint_end
            self.ended_since_fold = True
            part[END], part[STEP], part[OK] = rec["mono"], rec["step"], rec["ok"]
            part[WRITTEN] = rec["written"]
            part[WRITTEN_WALL] = rec["wall"] - (rec["mono"] - rec["written"])

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

    def record(self, ckpt: str, parts: dict[tuple[int, int], list[Any]], live: dict[int, int]) -> CheckpointRecord:
        ends = [p for p in parts.values() if p[END] is not None]
        failed = any(p[OK] is False for p in ends)
        pending = any(p[END] is None and live.get(r) == pid for (r, pid), p in parts.items())
        blocking = [b for b in map(self._blocking, parts.values()) if b is not None]
        background = [b for b in map(self._background, parts.values()) if b is not None]
        walls = [p[WRITTEN_WALL] for p in ends if p[OK]]
        steps = [p[STEP] for p in parts.values() if p[STEP] is not None]
        modes = [p[MODE] for p in parts.values() if p[MODE]]
        return CheckpointRecord(
            ckpt=ckpt, step=max(steps) if steps else -1, mode=modes[0] if modes else "",
            blocking_s=max(blocking) if blocking else None, background_s=max(background) if background else None,
            ok=False if failed else (None if pending or not ends else True),
            bytes=sum(p[BYTES] for p in parts.values()), written_wall=max(walls) if walls else None,
            ranks=sum(1 for p in parts.values() if p[START] is not None))

    def _done(self, parts: dict[tuple[int, int], list[Any]], live: dict[int, int]) -> bool:
        return all(p[END] is not None or live.get(r) != pid for (r, pid), p in parts.items())

    def _fold_one(self, ckpt: str, parts: dict[tuple[int, int], list[Any]], live: dict[int, int],
                  blocking: Buckets, background: Buckets) -> tuple[CheckpointRecord, bool]:
        record = self.record(ckpt, parts, live)
        for part in parts.values():
            b = self._blocking(part)
            if b is not None:
                blocking.observe(b)
            g = self._background(part)
            if g is not None:
                background.observe(g)
        return record, record.ok is True

    def fold(self, newest: float, window: float, live: dict[int, int]) -> None:
        self.ended_since_fold = False
        for ckpt in list(self.open):
            parts = self.open[ckpt]
            ends = [p[END] for p in parts.values() if p[END] is not None]
            if not self._done(parts, live) or (ends and max(ends) + window > newest):
                continue
            del self.open[ckpt]
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
            self.recent.append(record)

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
        for ckpt, parts in self.open.items():
            done = self._done(parts, live)
            if finished and done:
                record, durable = self._fold_one(ckpt, parts, live, blocking, background)
                if durable:
                    saves += 1
                    bytes_total += record.bytes
            else:
                record, durable = self.record(ckpt, parts, live), False
            open_records.append(record)
            failures += record.ok is False
            in_flight += record.ok is None and any(p[END] is None and live.get(r) == pid for (r, pid), p in parts.items())
            if record.ok is True:
                written = max(p[WRITTEN] for p in parts.values() if p[OK])
                if durable:
                    first = written if first is None else min(first, written)
                if last[0] is None or written > last[0]:
                    last = (written, record.written_wall, record.step)
        recent = list(self.recent) + sorted(open_records, key=lambda r: (r.step, r.ckpt))
        return {"blocking": blocking, "background": background, "saves": saves, "failures": failures,
                "bytes_total": bytes_total, "in_flight": in_flight, "last_written": last[0],
                "last_wall": last[1], "last_step": last[2], "first_written": first,
                "recent": tuple(recent[-RECENT:])}

    # --- state ---------------------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        return {
            "open": {ckpt: {f"{r}/{pid}": p for (r, pid), p in parts.items()} for ckpt, parts in self.open.items()},
            "blocking": self.blocking.to_state(), "background": self.background.to_state(),
            "saves": self.saves, "failures": self.failures, "bytes_total": self.bytes_total,
            "last": [self.last_written, self.last_wall, self.last_step], "first_written": self.first_written,
            "ended_since_fold": self.ended_since_fold,
            "recent": [[r.ckpt, r.step, r.mode, r.blocking_s, r.background_s, r.ok, r.bytes, r.written_wall, r.ranks]
                       for r in self.recent],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Checkpoints:
        out = cls()
        out.open = {ckpt: {_key(k): list(p) for k, p in parts.items()} for ckpt, parts in state["open"].items()}
        out.blocking = Buckets.from_state(CHECKPOINT_BUCKETS, state["blocking"])
        out.background = Buckets.from_state(CHECKPOINT_BUCKETS, state["background"])
        out.saves, out.failures, out.bytes_total = int(state["saves"]), int(state["failures"]), int(state["bytes_total"])
        out.last_written, out.last_wall, out.last_step = state["last"]
        out.first_written = state["first_written"]
        out.ended_since_fold = bool(state["ended_since_fold"])
        out.recent = deque((CheckpointRecord(*r) for r in state["recent"]), maxlen=RECENT)
        return out
