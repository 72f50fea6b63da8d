"""The report's timeline: journal records in, lanes of spans out, drawn as one inline SVG.

Pure: no I/O, no clock. ``TimelineBuilder.add`` takes journal events (``nvrx_slo.exporter.ingest.decode``) one at a time
(the report streams a whole journal through it next to the engine); ``build`` returns a
``Timeline``; ``render_svg`` draws it. Nothing the engine decides is re-derived here: which steps
were productive, lost or still unprotected (``decide``), which saves became durable, and what a
restart is and when each phase began (``build``) all come from the engine, so the picture and
the numbers never disagree.

Why it is bounded: a month-long journal holds millions of steps. Consecutive spans of one kind
closer than ``MERGE_PX`` pixels are merged into a run (so a lane never holds more spans per kind
than the plot has pixels / ``MERGE_PX``), at most ``MAX_LANES`` ranks are drawn, and only the
newest ``MAX_MARKERS`` checkpoints and restarts are marked; what was left out is counted and
said on the picture.

Time axis: each process's monotonic clock is mapped to wall time through the ``wall - mono``
offset of its first record, so processes on different nodes line up while spans within one
process keep their exact monotonic lengths even if the wall clock jumps.

Every string from the journal (ids, causes, pod names) is escaped with ``html.escape`` where it
is written into the SVG.
"""

from __future__ import annotations

import bisect
import html
import itertools
import math
from array import array
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
from nvrx_slo.exporter.engine.lanes import ProcessLanes
from nvrx_slo.exporter.engine.snapshot import CheckpointRecord
from nvrx_slo.exporter.events import Event

PLOT_WIDTH = 1100  # px of the time axis
MERGE_PX = 2  # spans of one kind closer than this are drawn as one run
GUTTER = 90  # px left of the plot for lane labels
MAX_LANES = 64
MAX_MARKERS = 400

# Span kinds, in drawing order (later ones on top); each has a CSS class "tl-<kind>".
INIT, STEP, LOST, UNPROTECTED = "init", "step", "lost", "unprotected"
RESTORE, BLOCKING, BACKGROUND = "restore", "blocking", "background"
KIND_LABELS = {
    INIT: "process start to first step",
    STEP: "training steps (productive)",
    LOST: "lost work (rolled back)",
    UNPROTECTED: "steps no durable save covers (yet)",
    RESTORE: "checkpoint restore",
    BLOCKING: "checkpoint blocking",
    BACKGROUND: "checkpoint background write",
}


@dataclass(frozen=True)
class Span:
    """``[start, end]`` in seconds since the timeline's origin; ``count`` spans merged into it."""

    kind: str
    start: float
    end: float
    count: int
    label: str


@dataclass(frozen=True)
class Lane:
    rank: int
    spans: tuple[Span, ...]
    pod: str = ""  # in a job's timeline: the pod whose process ran the rank (a lost pod's and its replacement's)


@dataclass(frozen=True)
class CheckpointMarker:
    """One save attempt: an id saved again after a rollback is a new attempt (new ``restart``/``iter``)."""

    ckpt: str
    at: float  # when it became durable (ok), failed, or — never finished — when it started
    status: str  # "ok" | "failed" | "unfinished" (still writing, or its process died first)
    step: int
    incarnation: tuple[int, int]  # (restart, iter) of the processes that started it


@dataclass(frozen=True)
class RestartBand:
    """One restart as the engine saw it, on the wall clock; ``phases`` are ``(phase, start, end)``."""

    level: str
    start_wall: float
    end_wall: float
    phases: tuple[tuple[str, float, float], ...]
    cause: str | None = None


@dataclass(frozen=True)
class Timeline:
    origin_wall: float  # wall time of x = 0
    duration: float
    lanes: tuple[Lane, ...]
    checkpoints: tuple[CheckpointMarker, ...]
    restarts: tuple[RestartBand, ...]
    lanes_omitted: int = 0
    checkpoints_omitted: int = 0
    restarts_omitted: int = 0


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


class TimelineBuilder:
    """Accumulate what the timeline needs from records, in compact form (a few floats per step).

    Which steps were productive or lost is the engine's decision (``Engine.take_verdicts``, handed
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
        """Take one journal event (``nvrx_slo.exporter.ingest.decode``)."""
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

    def decide(self, verdicts: Mapping[int, Sequence[tuple[float, float, bool]]]) -> None:
        """The engine's step verdicts (``Engine.take_verdicts``), by rank, in the order it made them."""
        for rank, taken in verdicts.items():
            if taken:
                data = self._ranks[rank]
                data.verdict_first.extend(first for first, _, _ in taken)
                data.verdict_last.extend(last for _, last, _ in taken)
                data.verdict_productive.extend(productive for _, _, productive in taken)

    def build(self, restarts: Sequence[RestartBand] = (), checkpoints: Sequence[CheckpointRecord] = ()) -> Timeline:
        """Finish: mark each step as the engine decided, merge spans to the pixel, cap lanes and markers."""
        return compose([("", self)], restarts, checkpoints)

    def step_kinds(self, rank: int) -> list[tuple[float, int, str]]:
        """``(end mono, step, kind)`` of each step of ``rank``, oldest first: what its lane draws."""
        data = self._ranks[rank]
        kinds = _kinds(data)
        return sorted((m, n, k) for m, n, k in zip(data.step_mono, data.step_no, kinds, strict=True) if k is not None)

    @staticmethod
    def _lane(rank: int, data: _RankData, lo: float, resolution: float, pod: str) -> Lane:
        kinds = _kinds(data)
        raw = ((kind, data.step_start[i] - lo, data.step_end[i] - lo, data.step_no[i])
               for i in _order(data.step_end) if (kind := kinds[i]) is not None)
        spans = _merge_steps(raw, resolution)
        others = sorted(data.spans, key=lambda s: s[1])
        spans += _merge_others([(k, s - lo, e - lo, label) for k, s, e, label in others], resolution)
        return Lane(rank=rank, spans=tuple(spans), pod=pod)


def compose(pods: Sequence[tuple[str, TimelineBuilder]], restarts: Sequence[RestartBand] = (),
            checkpoints: Sequence[CheckpointRecord] = ()) -> Timeline:
    """One timeline over ``(pod, builder)`` pairs on one time axis (a job's pods, each with its own
    engine; one pod named "" for a pod's own report). A rank run by two pods (a lost node's and its
    replacement's) gets a lane per pod, in the order given. ``restarts`` and ``checkpoints``: the
    job's, each pod's shares already merged (``exporter/engine/job.py``), one marker each."""
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


def _order(values: array) -> Sequence[int]:
    """The indices of ``values`` in increasing order of value: a ``range`` when they already are (a
    rank's records arrive in time order), so a lane of a million steps costs no list of indices."""
    if all(a <= b for a, b in itertools.pairwise(values)):
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


def _merge_steps(raw: Iterable[tuple[str, float, float, int]], resolution: float) -> list[Span]:
    """Runs of consecutive steps of one kind, split where a gap is wider than ``resolution``."""
    out: list[Span] = []
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


def _step_span(run: list[Any]) -> Span:
    kind, start, end, count, first, last = run
    what = {LOST: "lost ", UNPROTECTED: "unprotected "}.get(kind, "")
    steps = f"step {first}" if count == 1 else f"{count} {what}steps {first}–{last}"
    if count == 1 and what:
        steps = f"{what}step {first}"
    return Span(kind, start, end, count, f"{steps}, {end - start:.3f} s")


def _merge_others(raw: list[tuple[str, float, float, str]], resolution: float) -> list[Span]:
    """Merge same-kind spans closer than ``resolution`` (keeping the first label and a count)."""
    out: list[Span] = []
    open_: dict[str, Span] = {}
    for kind, start, end, label in raw:
        cur = open_.get(kind)
        if cur is not None and start - cur.end <= resolution:
            open_[kind] = Span(kind, cur.start, max(cur.end, end), cur.count + 1, cur.label)
            continue
        if cur is not None:
            out.append(_counted(cur))
        open_[kind] = Span(kind, start, end, 1, label)
    out.extend(_counted(s) for s in open_.values())
    return out


def _counted(span: Span) -> Span:
    if span.count == 1:
        return span
    return Span(span.kind, span.start, span.end, span.count, f"{span.count} merged, first: {span.label}")


# --- drawing -----------------------------------------------------------------------------------

ROW_H, BG_H = 20, 7  # per rank: a main row, a thin background-write row under it
LANE_H = ROW_H + BG_H + 6
TOP = 58  # axis, checkpoint row and restart-phase row above the lanes
PHASE_CLASSES = ("detect", "teardown", "rendezvous", "reinit", "restore")


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _nice_step(duration: float, target: int = 8) -> float:
    """A 1-2-5 tick interval giving about ``target`` ticks over ``duration``."""
    raw = max(duration / target, 1e-6)
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def render_svg(tl: Timeline) -> str:
    """The timeline as one ``<svg>`` element (CSS classes ``tl-*`` come from the page's stylesheet)."""
    scale = PLOT_WIDTH / max(tl.duration, 1e-9)

    def x(t: float) -> float:
        return round(GUTTER + max(0.0, t) * scale, 2)

    def w(start: float, end: float) -> float:
        return round(max((end - start) * scale, 0.75), 2)

    height = TOP + LANE_H * max(len(tl.lanes), 1) + 24
    out = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {GUTTER + PLOT_WIDTH + 10} {height}"'
        f' width="100%" role="img" aria-label="timeline, one lane per rank"'
        f' data-lanes="{len(tl.lanes)}" data-duration="{tl.duration:.3f}">'
    ]
    step = _nice_step(tl.duration)
    n = 0
    while n * step <= tl.duration + 1e-9:
        tx = x(n * step)
        out.append(f'<line class="tl-grid" x1="{tx}" y1="14" x2="{tx}" y2="{height - 20}"/>'
                   f'<text class="tl-tick" x="{tx}" y="11">{_e(_fmt_seconds(n * step))}</text>')
        n += 1
    out.append('<text class="tl-rowlabel" x="4" y="30">checkpoints</text>'
               '<text class="tl-rowlabel" x="4" y="48">restarts</text>')
    for r in tl.restarts:
        s, e = r.start_wall - tl.origin_wall, r.end_wall - tl.origin_wall
        title = f"{r.level} restart, {r.end_wall - r.start_wall:.2f} s" + (f" — cause: {r.cause}" if r.cause else "")
        out.append(f'<g class="tl-restart" data-kind="restart" data-level="{_e(r.level)}"><title>{_e(title)}</title>'
                   f'<rect class="tl-restart-band" x="{x(s)}" y="38" width="{w(s, e)}" height="{height - 58}"/>')
        for phase, ps, pe in r.phases:
            cls = phase if phase in PHASE_CLASSES else "other"
            out.append(f'<rect class="tl-phase tl-phase-{cls}" x="{x(ps - tl.origin_wall)}" y="40"'
                       f' width="{w(ps, pe)}" height="12"><title>{_e(f"{phase}: {pe - ps:.3f} s")}</title></rect>')
        out.append(f'<path class="tl-restart-mark" d="M{x(s)},36 l-4,-6 h8 z"/></g>')
    for m in tl.checkpoints:
        cx = x(m.at)
        state = {"ok": "durable", "failed": "FAILED",
                 "unfinished": "never finished (still writing, or its process died)"}
        title = f"{m.ckpt} (step {m.step}, restart {m.incarnation[0]}, iteration {m.incarnation[1]}): {state[m.status]}"
        out.append(f'<path class="tl-ckpt tl-ckpt-{m.status}" data-kind="checkpoint" data-ckpt="{_e(m.ckpt)}"'
                   f' d="M{cx},20 l5,6 l-5,6 l-5,-6 z"><title>{_e(title)}</title></path>')
    for i, lane in enumerate(tl.lanes):
        y = TOP + i * LANE_H
        pod = (f'<text class="tl-podlabel" x="4" y="{y + ROW_H + 6}">{_e(_short(lane.pod))}'
               f"<title>pod {_e(lane.pod)}</title></text>") if lane.pod else ""
        out.append(f'<g class="tl-lane" data-rank="{lane.rank}" data-pod="{_e(lane.pod)}">'
                   f'<text class="tl-lanelabel" x="4" y="{y + 15}">rank {lane.rank}</text>{pod}'
                   f'<rect class="tl-lanebg" x="{GUTTER}" y="{y}" width="{PLOT_WIDTH}" height="{ROW_H}"/>')
        for sp in lane.spans:
            top, h = (y + ROW_H + 1, BG_H) if sp.kind == BACKGROUND else (y, ROW_H)
            out.append(f'<rect class="tl-{sp.kind}" x="{x(sp.start)}" y="{top}" width="{w(sp.start, sp.end)}"'
                       f' height="{h}" data-count="{sp.count}"><title>{_e(sp.label)}</title></rect>')
        out.append("</g>")
    notes = []
    if tl.lanes_omitted:
        notes.append(f"{tl.lanes_omitted} more ranks not drawn")
    if tl.checkpoints_omitted:
        notes.append(f"{tl.checkpoints_omitted} older checkpoints not marked")
    if tl.restarts_omitted:
        notes.append(f"{tl.restarts_omitted} older restarts not marked")
    if notes:
        out.append(f'<text class="tl-note" x="{GUTTER}" y="{height - 6}">{_e("; ".join(notes))}</text>')
    out.append("</svg>")
    return "".join(out)


def _short(pod: str, keep: int = 14) -> str:
    """A pod name that fits the lane gutter: its end, where generated names differ."""
    return pod if len(pod) <= keep else "…" + pod[-(keep - 1):]


def _fmt_seconds(t: float) -> str:
    if t >= 3600:
        return f"{t / 3600:.4g} h"
    if t >= 120:
        return f"{t / 60:.4g} min"
    return f"{t:.4g} s"


def legend_html() -> str:
    """A legend for the span kinds and restart phases, as HTML (classes match the SVG's)."""
    def key(classes: str, label: str) -> str:
        return (f'<span class="tl-key"><svg width="14" height="10"><rect class="{classes}" width="14" height="10"/>'
                f'</svg>{label}</span>')

    items = [key(f"tl-{k}", _e(v)) for k, v in KIND_LABELS.items()]
    items.append(key("tl-restart-mark", "restart (marked at its fault, shaded across the lanes)"))
    items += [key(f"tl-phase tl-phase-{p}", f"restart: {p}") for p in PHASE_CLASSES]
    items += [f'<span class="tl-key"><svg width="12" height="12"><path class="tl-ckpt tl-ckpt-{status}" '
              f'd="M6,0 l5,6 l-5,6 l-5,-6 z"/></svg>checkpoint {text}</span>'
              for status, text in (("ok", "durable"), ("failed", "failed"), ("unfinished", "never finished"))]
    return '<div class="tl-legend">' + "".join(items) + "</div>"
