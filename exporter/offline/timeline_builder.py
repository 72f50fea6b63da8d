"""The report's timeline, built: journal records in, the views' ``Timeline`` out (drawn by
``nvrx_slo.exporter.views.timeline``).

``TimelineBuilder.add`` takes journal events one at a time (the replay streams a whole journal
through it next to the engine, ``nvrx_slo.exporter.offline.replay``); ``build`` (one pod) or
``compose`` (a job's pods) returns a ``Timeline``. Nothing the engine decides is re-derived here:
which steps were productive, lost or still unprotected (``decide``), which saves became durable,
and what a restart is and when each phase began (``build``) all come from the engine, so the
picture and the numbers never disagree.

Time axis: each process's monotonic clock is mapped to wall time through the ``wall - mono``
offset of its first record, so processes on different nodes line up while spans within one
process keep their exact monotonic lengths even if the wall clock jumps.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, gt, le, ne, or_, sub
from typing import Any, cast

from nvrx_slo.contracts.schema import (
    CheckpointEnd,
    CheckpointFinalize,
    CheckpointScheduled,
    CheckpointStart,
    EventType,
    Restore,
    Step,
    StepFailed,
)
from nvrx_slo.exporter.engine.engine import Decisions
from nvrx_slo.exporter.engine.lanes import ProcessLanes
from nvrx_slo.exporter.engine.snapshot import CheckpointRecord
from nvrx_slo.exporter.events import Event
from nvrx_slo.exporter.views.timeline import (
    BACKGROUND,
    BLOCKING,
    INIT,
    LOST,
    MAX_LANES,
    MAX_MARKERS,
    MERGE_PX,
    PLOT_WIDTH,
    RESTORE,
    STEP,
    UNPROTECTED,
    Bar,
    CheckpointMarker,
    RestartBand,
    Row,
    Timeline,
)

_PROCESS_KIND = attrgetter("pod", "pid", "type")
_MONO, _START, _STEP_NO, _RANK = attrgetter("mono"), attrgetter("start"), attrgetter("step"), attrgetter("rank")


@dataclass
class _RankData:
    # steps as parallel arrays: start, end (process-local monotonic + offset = wall), end (mono),
    # step number, and the engine's verdict (UNDECIDED until it hands one in)
    step_start: array = field(default_factory=lambda: array("d"))
    step_end: array = field(default_factory=lambda: array("d"))
    step_mono: array = field(default_factory=lambda: array("d"))
    step_no: array = field(default_factory=lambda: array("q"))
    step_partial: array = field(default_factory=lambda: array("b"))  # 1: a step an exception left
    # the engine's verdicts, in order, as parallel arrays (a long job has one per step): the steps that
    # ended in [first, last] (mono), productive or not
    verdict_first: array = field(default_factory=lambda: array("d"))
    verdict_last: array = field(default_factory=lambda: array("d"))
    verdict_productive: array = field(default_factory=lambda: array("b"))
    spans: list[tuple[str, float, float, str]] = field(default_factory=list)  # init/restore/blocking/background
    offset: float = 0.0  # wall - mono of the rank's newest process (one clock per node)
    waits_end: float = float("-inf")  # the end (mono) of the newest wait on saves drawn


class TimelineBuilder:
    """Accumulate what the timeline needs from records, in compact form (a few floats per step).

    Which steps were productive or lost is the engine's decision (``Engine.take_decisions``, handed
    in with ``decide``); which saves became durable and which restarts happened are the engine's
    records (``Engine.history``, handed to ``build``). The builder only places them in time."""

    def __init__(self) -> None:
        self._offsets: dict[tuple[str, int], float] = {}  # (pod, pid) -> wall - mono
        self._ranks: dict[int, _RankData] = defaultdict(_RankData)
        self._lane_of = ProcessLanes()  # one pod's records: a pid is one process
        self._ckpt_started: dict[tuple[int, str], float] = {}  # (rank, ckpt) -> blocking start
        self._ckpt_scheduled: dict[tuple[int, str], float] = {}  # (rank, ckpt) -> background start
        self._started: dict[tuple[str, int], float] = {}  # (pod, pid) -> process start, until its first step
        self._lo = float("inf")
        self._hi = float("-inf")

    def add(self, rec: Event) -> None:
        """Take one journal event (``nvrx_slo.exporter.events``)."""
        key = (rec.pod, rec.pid)
        off = self._offsets.setdefault(key, rec.wall - rec.mono)
        t = rec.mono + off
        self._lo = min(self._lo, t)
        self._hi = max(self._hi, t)
        rank = rec.rank
        if rank is None:
            return  # launcher records only matter through the engine's restarts
        rank = self._lane_of.of(rec.pid, rank, rec.local_rank)
        data = self._ranks[rank]
        data.offset = off
        if isinstance(rec, (Step, Restore)) and key in self._started:
            begun = self._started.pop(key)
            data.spans.append((INIT, begun, rec.start + off, f"process {rec.pid} start to first work"))
        if rec.type is EventType.PROCESS_START:
            self._started[key] = t
        elif isinstance(rec, (Step, StepFailed)):
            data.step_start.append(rec.start + off)
            data.step_end.append(t)
            data.step_mono.append(rec.mono)
            data.step_no.append(rec.step)
            data.step_partial.append(isinstance(rec, StepFailed))
            self._lo = min(self._lo, rec.start + off)
        elif isinstance(rec, Restore):
            data.spans.append((RESTORE, rec.start + off, t, f"restore from step {rec.step}"))
        elif isinstance(rec, CheckpointStart):
            self._ckpt_started[(rank, rec.ckpt)] = t
        elif isinstance(rec, CheckpointScheduled):
            ckpt = rec.ckpt
            start = self._ckpt_started.pop((rank, ckpt), None)
            if start is not None:
                data.spans.append((BLOCKING, start, t, f"{ckpt}: save blocked {t - start:.3f} s"))
            self._ckpt_scheduled[(rank, ckpt)] = t
        elif isinstance(rec, CheckpointFinalize):
            data.spans.append((BLOCKING, rec.start + off, t, f"{rec.ckpt}: finalize {t - rec.start - off:.3f} s"))
        elif isinstance(rec, CheckpointEnd):
            ckpt = rec.ckpt
            written = rec.written + off
            start = self._ckpt_scheduled.pop((rank, ckpt), None)
            if start is not None:
                state = "written" if rec.ok else f"failed: {rec.error}"
                data.spans.append((BACKGROUND, start, written,
                                   f"{ckpt}: {state} in {written - start:.3f} s background"))

    def add_many(self, records: Iterable[Event]) -> None:
        """``add`` each record in order: a process's consecutive steps (most of a journal) together,
        placed as ``add`` places each one."""
        for (pod, pid, kind), group in itertools.groupby(records, _PROCESS_KIND):
            if kind is not EventType.STEP:
                for rec in group:
                    self.add(rec)
                continue
            steps = cast("list[Step]", list(group))
            if ((pod, pid) in self._started or (pod, pid) not in self._offsets or pid not in self._lane_of.of_pid
                    or None in map(_RANK, steps)):
                self.add(steps[0])  # the process's first step, or its first work: what only ``add`` knows
                del steps[0]
            if steps and None not in map(_RANK, steps):
                self._steps(self._offsets[(pod, pid)], self._ranks[self._lane_of.of_pid[pid]], steps)
            else:
                for rec in steps:
                    self.add(rec)

    def _steps(self, off: float, data: _RankData, steps: list[Step]) -> None:
        """``add`` each of a process's steps, with its clock's offset and its lane's data."""
        data.offset = off
        monos = list(map(_MONO, steps))
        ends = list(map(off.__add__, monos))  # rec.mono + off, as ``add`` sums it
        starts = list(map(off.__add__, map(_START, steps)))
        data.step_start.extend(starts)
        data.step_end.extend(ends)
        data.step_mono.extend(monos)
        data.step_no.extend(map(_STEP_NO, steps))
        data.step_partial.frombytes(bytes(len(steps)))  # none of them a step an exception left
        self._lo = min(self._lo, min(ends), min(starts))
        self._hi = max(self._hi, max(ends))

    def decide(self, decisions: Mapping[int, Decisions]) -> None:
        """The engine's decisions (``Engine.take_decisions``), by rank, in the order it made them:
        its step verdicts, and the waits on saves it booked as blocking (drawn as it booked them)."""
        for rank, (verdicts, waits) in decisions.items():
            if not (verdicts or waits):
                continue
            data = self._ranks[rank]
            if verdicts:
                firsts, lasts, productive = zip(*verdicts, strict=True)
                data.verdict_first.extend(firsts)
                data.verdict_last.extend(lasts)
                data.verdict_productive.extend(productive)
            for start, end in waits:
                if end > data.waits_end:  # not one the reorder window's settling handed out already
                    data.waits_end = end
                    data.spans.append((BLOCKING, start + data.offset, end + data.offset,
                                       f"waits on saves, {1e3 * (end - start):.1f} ms"))

    def build(self, restarts: Sequence[RestartBand] = (), checkpoints: Sequence[CheckpointRecord] = ()) -> Timeline:
        """Finish: mark each step as the engine decided, merge spans to the pixel, cap lanes and markers."""
        return compose([("", self)], restarts, checkpoints)

    @staticmethod
    def _lane(rank: int, data: _RankData, lo: float, resolution: float, pod: str) -> Row:
        kinds = _kinds(data)
        spans = _merged_in_order(data, kinds, lo, resolution)
        if spans is None:
            raw = ((kind, data.step_start[i] - lo, data.step_end[i] - lo, data.step_no[i])
                   for i in _order(data.step_end) if (kind := kinds[i]) is not None)
            spans = _merge_steps(raw, resolution)
        others = sorted(data.spans, key=lambda s: s[1])
        spans += _merge_others([(k, s - lo, e - lo, label) for k, s, e, label in others], resolution)
        return Row(rank=rank, bars=tuple(spans), pod=pod)


def compose(pods: Sequence[tuple[str, TimelineBuilder]], restarts: Sequence[RestartBand] = (),
            checkpoints: Sequence[CheckpointRecord] = ()) -> Timeline:
    """One timeline over ``(pod, builder)`` pairs on one time axis (a job's pods, each with its own
    engine; one pod named "" for a pod's own report). A rank run by two pods (a lost node's and its
    replacement's) gets a lane per pod, in the order given. ``restarts`` and ``checkpoints``: the
    job's, each pod's shares already merged (``exporter/offline/rollup.py``), one marker each."""
    lo = min([b._lo for _, b in pods] + [r.start_wall for r in restarts])
    hi = max([b._hi for _, b in pods] + [r.end_wall for r in restarts])
    if lo > hi:  # nothing at all
        lo = hi = 0.0
    duration = max(hi - lo, 1e-9)
    resolution = MERGE_PX * duration / PLOT_WIDTH
    order = sorted((rank, i) for i, (_, b) in enumerate(pods) for rank in b._ranks)
    lanes = tuple(pods[i][1]._lane(rank, pods[i][1]._ranks[rank], lo, resolution, pods[i][0])
                  for rank, i in order[:MAX_LANES])
    markers = sorted((m for m in (_marker(c, lo) for c in checkpoints) if m is not None), key=lambda m: m.at)
    bands = sorted(restarts, key=lambda r: r.start_wall)
    return Timeline(
        origin_wall=lo,
        duration=hi - lo,
        lanes=lanes,
        checkpoints=tuple(markers[-MAX_MARKERS:]),
        restarts=tuple(bands[-MAX_MARKERS:]),
        lanes_omitted=max(0, len(order) - MAX_LANES),
        checkpoints_omitted=max(0, len(markers) - MAX_MARKERS),
        restarts_omitted=max(0, len(bands) - MAX_MARKERS),
    )


def _kinds(data: _RankData) -> list[str | None]:
    """Each step's kind (by index), from the engine's verdicts: a verdict covers the steps that
    ended in its [first, last] and that no earlier verdict decided. A step an exception left is
    drawn only when the engine counted it (lost), not when a restart was already under way."""
    order = _order(data.step_mono)
    ends = data.step_mono if isinstance(order, range) else array("d", (data.step_mono[i] for i in order))
    kinds: list[str | None] = [None if partial else UNPROTECTED for partial in data.step_partial]
    for first, last, productive in zip(data.verdict_first, data.verdict_last, data.verdict_productive, strict=True):
        for j in range(bisect.bisect_left(ends, first), bisect.bisect_right(ends, last)):
            i = order[j]
            if kinds[i] is UNPROTECTED or (kinds[i] is None and data.step_partial[i]):
                kinds[i] = STEP if productive else LOST
    return kinds


def _merged_in_order(data: _RankData, kinds: list[str | None], lo: float, resolution: float) -> list[Bar] | None:
    """``_merge_steps`` of a lane whose steps all are drawn and end in time order (the usual case), in
    C-level passes: a run ends where the kind changes or the gap to the step before is wider than
    ``resolution``, as there; None where that is not so."""
    if None in kinds or not isinstance(_order(data.step_end), range):
        return None
    starts, ends = data.step_start, data.step_end
    gaps = map(sub, map(sub, itertools.islice(starts, 1, None), itertools.repeat(lo)),
               map(sub, ends, itertools.repeat(lo)))  # as the merge sees them: each relative to ``lo``
    changes = map(ne, itertools.islice(kinds, 1, None), kinds)
    cuts = itertools.compress(itertools.count(1), map(or_, changes, map(gt, gaps, itertools.repeat(resolution))))
    bounds = [0, *cuts, len(kinds)] if kinds else []
    no = data.step_no
    return [_step_span([kinds[a], starts[a] - lo, ends[b - 1] - lo, b - a, no[a], no[b - 1]])
            for a, b in itertools.pairwise(bounds)]


def _order(values: array) -> Sequence[int]:
    """The indices of ``values`` in increasing order of value: a ``range`` when they already are (a
    rank's records arrive in time order), so a lane of a million steps costs no list of indices."""
    if all(map(le, values, itertools.islice(values, 1, None))):
        return range(len(values))
    return sorted(range(len(values)), key=values.__getitem__)


def _marker(record: CheckpointRecord, lo: float) -> CheckpointMarker | None:
    """A save as the engine recorded it: durable at its write's end, else placed where it began."""
    status = {True: "ok", False: "failed", None: "unfinished"}[record.ok]
    at = record.written_wall if record.ok else record.began_wall
    if at is None:
        return None  # an end without a start or a write: nowhere to draw it
    return CheckpointMarker(ckpt=record.ckpt, at=at - lo, status=status, step=record.step,
                            incarnation=record.incarnation)


def _merge_steps(raw: Iterable[tuple[str, float, float, int]], resolution: float) -> list[Bar]:
    """Runs of consecutive steps of one kind, split where a gap is wider than ``resolution``."""
    out: list[Bar] = []
    run: list[Any] | None = None  # [kind, start, end, count, first_step, last_step]
    for kind, start, end, step in raw:
        if run is not None and run[0] == kind and start - run[2] <= resolution:
            run[2] = max(run[2], end)
            run[3] += 1
            run[5] = step
            continue
        if run is not None:
            out.append(_step_span(run))
        run = [kind, start, end, 1, step, step]
    if run is not None:
        out.append(_step_span(run))
    return out


def _step_span(run: list[Any]) -> Bar:
    kind, start, end, count, first, last = run
    what = {LOST: "lost ", UNPROTECTED: "unprotected "}.get(kind, "")
    steps = f"step {first}" if count == 1 else f"{count} {what}steps {first}–{last}"
    if count == 1 and what:
        steps = f"{what}step {first}"
    return Bar(kind, start, end, count, f"{steps}, {end - start:.3f} s")


def _merge_others(raw: list[tuple[str, float, float, str]], resolution: float) -> list[Bar]:
    """Merge same-kind spans closer than ``resolution`` (keeping the first label and a count)."""
    out: list[Bar] = []
    open_: dict[str, Bar] = {}
    for kind, start, end, label in raw:
        cur = open_.get(kind)
        if cur is not None and start - cur.end <= resolution:
            open_[kind] = Bar(kind, cur.start, max(cur.end, end), cur.count + 1, cur.label)
            continue
        if cur is not None:
            out.append(_counted(cur))
        open_[kind] = Bar(kind, start, end, 1, label)
    out.extend(_counted(s) for s in open_.values())
    return out


def _counted(span: Bar) -> Bar:
    if span.count == 1:
        return span
    return Bar(span.kind, span.start, span.end, span.count, f"{span.count} merged, first: {span.label}")
