"""Pod-level checkpoint aggregates, built from each rank's checkpoint_* events in any order.

Every rank journals its part of a save (see ``trainer/reference/checkpoint.py``). Per rank and save: blocking
= ``checkpoint_start`` → ``checkpoint_scheduled`` plus its ``checkpoint_finalize`` spans and the
loop's later waits on it (its end's ``waited_s``); background = ``scheduled`` → ``written`` (the
instant the writer finished). The histograms take one observation per rank per save. A save
(checkpoint id) is durable when every rank that started it ended ok, failed when any rank's end is
not ok, and abandoned for a rank whose process died before its end. Each quantity is a pure
function of the events seen, so the order they arrive in does not matter. Each record is stored
under its own incarnation; a process's part without a start (an async save's end written after an
in-process restart) is read as part of the newest save of that id the process started at or before
its iteration (``_grouped``). A save enters the histograms, ``saves`` and ``bytes_total`` once
nothing can join it any more (see ``Checkpoints.fold``) or the job is over (``Checkpoints.settle``).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from nvrx_slo.contracts.schema import CheckpointEnd, CheckpointFinalize, CheckpointScheduled, CheckpointStart
from nvrx_slo.exporter.engine.histogram import Buckets, CheckpointBuckets
from nvrx_slo.exporter.engine.snapshot import CheckpointRecord
from nvrx_slo.exporter.events import AFTER_ALL, Event

RECENT = 32
MAX_OPEN = 64  # saves waiting for ranks that never report are closed, oldest first, beyond this


@dataclass(slots=True)
class Part:
    """One process's part of a save: what its records of it said, merged (``merged``)."""

    rank: int
    pid: int
    last: float  # mono of its newest record
    start: float | None = None  # checkpoint_start's mono: the loop blocked from here
    start_wall: float | None = None
    step: int | None = None
    mode: str = ""
    scheduled: float | None = None  # checkpoint_scheduled's mono: the loop resumed
    bytes: int = 0
    finalize_s: float = 0.0  # its finalize spans and the loop's later waits on it
    end: float | None = None  # checkpoint_end's mono
    written: float | None = None  # the instant the write finished
    written_wall: float | None = None
    ok: bool | None = None

    @classmethod
    def of(cls, rec: Event, rank: int) -> Part:
        """The part one checkpoint_* record of rank ``rank`` makes on its own."""
        part = cls(rank, rec.pid, rec.mono)
        part.take(rec)
        return part

    def take(self, rec: Event) -> None:
        """Merge in one more record of this part's process and save: what ``merged`` makes of this
        part and ``Part.of(rec)``, without making either (once per record of a save)."""
        mono = rec.mono
        if mono > self.last:
            self.last = mono
        if isinstance(rec, CheckpointStart):
            if self.start is None or mono < self.start:
                self.start, self.start_wall = mono, rec.wall
            if self.step is None or rec.step > self.step:
                self.step = rec.step
            self.mode = self.mode or rec.mode
        elif isinstance(rec, CheckpointScheduled):
            if self.scheduled is None or mono > self.scheduled:
                self.scheduled = mono
            if rec.bytes > self.bytes:
                self.bytes = rec.bytes
        elif isinstance(rec, CheckpointFinalize):
            self.finalize_s += max(0.0, mono - rec.start)
        elif isinstance(rec, CheckpointEnd):
            ok = rec.ok
            self.ok = ok if self.ok is None else self.ok and ok
            if self.step is None or rec.step > self.step:
                self.step = rec.step
            if self.end is None or mono > self.end:
                self.end, self.written, self.written_wall = mono, rec.written, rec.wall - (mono - rec.written)
            self.finalize_s += rec.waited_s or 0.0

    def merged(self, b: Part) -> Part:
        """This part and another of the same process's save as one (a new part): earliest start,
        latest end, one failure fails the part, finalize spans summed."""
        start, start_wall = (b.start, b.start_wall) if b.start is not None and (
            self.start is None or b.start < self.start) else (self.start, self.start_wall)
        end, written, written_wall = (b.end, b.written, b.written_wall) if b.end is not None and (
            self.end is None or b.end > self.end) else (self.end, self.written, self.written_wall)
        return Part(self.rank, self.pid, max(self.last, b.last), start, start_wall,
                    max((s for s in (self.step, b.step) if s is not None), default=None), self.mode or b.mode,
                    max((s for s in (self.scheduled, b.scheduled) if s is not None), default=None),
                    max(self.bytes, b.bytes), self.finalize_s + b.finalize_s, end, written, written_wall,
                    b.ok if self.ok is None else (self.ok if b.ok is None else self.ok and b.ok))

    def blocking(self) -> float | None:
        if self.start is None or self.scheduled is None:
            return None
        return max(0.0, self.scheduled - self.start) + self.finalize_s

    def background(self) -> float | None:
        if not self.ok or self.scheduled is None or self.written is None:
            return None
        return max(0.0, self.written - self.scheduled)


@dataclass(slots=True)
class Save:
    """One save of a checkpoint id as stored: the id within one incarnation (a restarted job may
    save an id again after a rollback: the restart count and Wrapper iteration tell them apart)."""

    restart: int
    iter: int
    ckpt: str
    # its parts by pid: a process's records all go to one rank (``ProcessLanes``), and a process
    # that saves one id twice in one iteration (a retry) has one part for both
    parts: dict[int, Part] = field(default_factory=dict)


class _Group(NamedTuple):
    """A save as read (``_grouped``): the stored save it is, its parts merged by pid, and the
    stored (save, pid) parts it is made of."""

    save: Save
    parts: dict[int, Part]
    members: list[tuple[Save, int]]


def _began(parts: Iterable[Part]) -> float:
    return min(p.start if p.start is not None else p.last for p in parts)


def _order(folded: tuple[float, CheckpointRecord]) -> tuple[float, tuple[int, int], str]:
    began, record = folded
    return began, record.incarnation, record.ckpt


def _done(parts: dict[int, Part], live: dict[int, int]) -> bool:
    return all(p.end is not None or live.get(p.rank) != p.pid for p in parts.values())


@dataclass(frozen=True)
class CheckpointsView:
    """The aggregates as of an instant: folded history plus the saves still open."""

    blocking: Buckets
    background: Buckets
    saves: int
    failures: int
    bytes_total: int
    in_flight: int
    last_written: float | None  # mono of the newest durable save
    last_wall: float | None
    last_step: int | None
    first_written: float | None
    recent: tuple[CheckpointRecord, ...]  # the newest ``RECENT``, oldest first
    records: tuple[CheckpointRecord, ...]  # every one kept, oldest first


@dataclass(slots=True)
class Checkpoints:
    """``keep``: folded saves kept as records (None: all, for an offline replay)."""

    window: float
    keep: int | None = RECENT
    open: dict[str, list[Save]] = field(default_factory=dict)  # by checkpoint id
    blocking: CheckpointBuckets = field(default_factory=CheckpointBuckets)
    background: CheckpointBuckets = field(default_factory=CheckpointBuckets)
    saves: int = 0
    failures: int = 0
    bytes_total: int = 0
    last_written: float | None = None  # mono of the newest durable save
    last_wall: float | None = None
    last_step: int | None = None
    first_written: float | None = None
    recent: list[tuple[float, CheckpointRecord]] = field(default_factory=list)  # (began, record), ``_order``
    due: float = AFTER_ALL  # no save can fold before the pod's newest record reaches this

    def add(self, rec: Event, ckpt: str, rank: int) -> bool:
        """One checkpoint_* event (a ``schema.CheckpointPart``: checkpoint_worker is the ledger's) of
        save ``ckpt`` and rank ``rank``. Returns whether it gave its start to a part read without
        one: that part leaves the earlier save ``_grouped`` had joined it to, which may be over now
        (``fold`` again)."""
        saves = self.open.get(ckpt)
        if saves is None:
            saves = self.open[ckpt] = []
        restart, it = rec.restart, rec.iter
        for save in saves:
            if save.restart == restart and save.iter == it:
                break
        else:
            save = Save(restart, it, ckpt)
            saves.append(save)
            if sum(map(len, self.open.values())) > MAX_OPEN:
                oldest = min((s for ss in self.open.values() for s in ss),
                             key=lambda s: (_began(s.parts.values()) if s.parts else float("inf"), s.restart, s.iter,
                                            s.ckpt))
                self._remove(oldest)
                self._close(oldest, oldest.parts, {})
        # Parts combine commutatively (``Part.take``), so arrival order cannot matter.
        part = save.parts.get(rec.pid)
        if part is None:
            part = save.parts[rec.pid] = Part.of(rec, rank)
            gave = False
        else:
            gave = part.start is None and isinstance(rec, CheckpointStart)
            part.take(rec)
        if part.last + self.window < self.due:
            self.due = part.last + self.window
        return gave

    def startless(self, ckpt: str, pid: int) -> bool:
        """Whether an open save ``ckpt`` holds a part of process ``pid`` read without its start (which
        a start of it would give one: ``add`` returns True)."""
        return any(part.start is None for save in self.open.get(ckpt, ()) if (part := save.parts.get(pid)) is not None)

    def rearm(self, at: float) -> None:
        """A rank's process changed (it died, or another took its lane): a save it left unfinished
        may be over: the saves fold before the next record is taken (``at``: the pod's newest instant)."""
        if self.open:
            self.due = at

    def _remove(self, save: Save) -> None:
        saves = self.open[save.ckpt]
        saves[:] = [s for s in saves if s is not save]
        if not saves:
            del self.open[save.ckpt]

    def _grouped(self) -> list[_Group]:
        """The open saves as read: a process's part without a start joins the newest save of that id
        the process started at or before the part's iteration (the same restart), in whatever order
        the records came. Nearly always every part has its start, and the stored saves are the saves read."""
        stored = [save for saves in self.open.values() for save in saves]
        if all(part.start is not None for save in stored for part in save.parts.values()):
            return [_Group(save, save.parts, [(save, pid) for pid in save.parts]) for save in stored]
        started: dict[tuple[int, str, int], list[Save]] = {}  # (restart, ckpt, pid) -> the saves it started
        for save in stored:
            for pid, part in save.parts.items():
                if part.start is not None:
                    started.setdefault((save.restart, save.ckpt, pid), []).append(save)
        groups: dict[int, _Group] = {}  # by id() of the save read
        for save in stored:
            for pid, part in save.parts.items():
                home = save
                if part.start is None:
                    earlier = [s for s in started.get((save.restart, save.ckpt, pid), ()) if s.iter <= save.iter]
                    if earlier:
                        home = max(earlier, key=lambda s: s.iter)
                group = groups.get(id(home))
                if group is None:
                    group = groups[id(home)] = _Group(home, {}, [])
                group.parts[pid] = group.parts[pid].merged(part) if pid in group.parts else part
                group.members.append((save, pid))
        return list(groups.values())

    @staticmethod
    def record(save: Save, parts: dict[int, Part], live: dict[int, int]) -> CheckpointRecord:
        """The save as its parts say: the slowest rank's times, the bytes of all (one pass: once per save)."""
        ended = failed = pending = False
        began = blocking = background = wall = None
        step: int | None = None
        mode, size, ranks = "", 0, 0
        for p in parts.values():
            if p.end is None:
                pending = pending or live.get(p.rank) == p.pid
            else:
                ended = True
                failed = failed or p.ok is False
                if p.ok and p.written_wall is not None and (wall is None or p.written_wall > wall):
                    wall = p.written_wall
            b, g = p.blocking(), p.background()
            if b is not None and (blocking is None or b > blocking):
                blocking = b
            if g is not None and (background is None or g > background):
                background = g
            if p.step is not None and (step is None or p.step > step):
                step = p.step
            mode = mode or p.mode
            if p.start_wall is not None and (began is None or p.start_wall < began):
                began = p.start_wall
            size += p.bytes
            ranks += p.start is not None
        return CheckpointRecord(
            ckpt=save.ckpt, incarnation=(save.restart, save.iter), began_wall=began,
            step=-1 if step is None else step, mode=mode, blocking_s=blocking, background_s=background,
            ok=False if failed else (None if pending or not ended else True), bytes=size, written_wall=wall,
            ranks=ranks)

    def fold(self, newest: float, live: dict[int, int], pid_at: Callable[[int, float], int | None]) -> None:
        """Move saves into the history once nothing can join them any more: every part is done,
        the newest record in the pod is ``window`` past the save's newest record, and every rank
        without a part was not running, at the save's start, the process it runs now
        (``pid_at(rank, mono)``: the rank's process at that instant).

        Call it before adding a record whenever ``newest >= due`` (and after a rank's process
        changed), so that a later save of the same id never joins one that is over."""
        due = AFTER_ALL
        for save, parts, members in self._grouped():
            last = max(p.last for p in parts.values()) + self.window
            if last > newest:
                due = min(due, last)
                continue
            if not _done(parts, live):
                continue  # re-armed by its next record or a process change
            ranks = {p.rank for p in parts.values()}
            begun = _began(parts.values())
            if any(rank not in ranks and pid_at(rank, begun) == pid for rank, pid in live.items()):
                continue
            self._take(save, parts, members, live)
        self.due = due

    def settle(self, live: dict[int, int]) -> None:
        """Fold every save whose parts are done: nothing more will join them (``Engine.settle``)."""
        for save, parts, members in self._grouped():
            if _done(parts, live):
                self._take(save, parts, members, live)

    def _take(self, save: Save, parts: dict[int, Part], members: list[tuple[Save, int]],
              live: dict[int, int]) -> None:
        """Move one save read (``_grouped``) out of the open ones into the history."""
        parts = dict(parts)  # the stored dict itself when nothing was regrouped
        for stored, pid in members:
            del stored.parts[pid]
            if not stored.parts:
                self._remove(stored)
        self._close(save, parts, live)

    def _close(self, save: Save, parts: dict[int, Part], live: dict[int, int]) -> None:
        record = self.record(save, parts, live)
        written = None
        for part in parts.values():
            b = part.blocking()
            if b is not None:
                self.blocking.observe(b)
            g = part.background()
            if g is not None:
                self.background.observe(g)
            if part.ok and part.written is not None and (written is None or part.written > written):
                written = part.written
        if record.ok is False:
            self.failures += 1
        if record.ok is True:
            assert written is not None  # a durable save has a rank whose write ended ok
            self.saves += 1
            self.bytes_total += record.bytes
            self.first_written = written if self.first_written is None else min(self.first_written, written)
            if self.last_written is None or written > self.last_written:
                self.last_written, self.last_wall, self.last_step = written, record.written_wall, record.step
        folded = (_began(parts.values()), record)
        recent = self.recent
        if recent and _order(folded) < _order(recent[-1]):
            insort(recent, folded, key=_order)
        else:  # saves fold in the order they began, nearly always: where ``insort`` would put it
            recent.append(folded)
        if self.keep is not None and len(recent) > self.keep:
            del recent[:-self.keep]

    def view(self, live: dict[int, int]) -> CheckpointsView:
        """The aggregates as of now: folded history plus open saves."""
        failures = self.failures
        last = (self.last_written, self.last_wall, self.last_step)
        in_flight = 0
        open_records = []
        for save, parts, members in self._grouped():
            record = self.record(save, parts, live)
            open_records.append((_began(parts.values()), record))
            # a part read without its start may yet move to another save (``_grouped``): an open
            # save's failure counts once a stored part that has its start failed, which stays put,
            # so the counter never goes down when a part moves
            failures += any(stored.parts[pid].start is not None and stored.parts[pid].ok is False
                            for stored, pid in members)
            in_flight += record.ok is None and any(p.end is None and live.get(p.rank) == p.pid
                                                   for p in parts.values())
            if record.ok is True:
                written = max(p.written for p in parts.values() if p.ok and p.written is not None)
                if last[0] is None or written > last[0]:
                    last = (written, record.written_wall, record.step)
        recent = [r for _, r in sorted(self.recent + open_records, key=_order)]
        return CheckpointsView(self.blocking, self.background, self.saves, failures, self.bytes_total, in_flight,
                               last[0], last[1], last[2], self.first_written, tuple(recent[-RECENT:]), tuple(recent))
