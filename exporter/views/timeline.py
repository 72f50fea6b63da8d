"""The report's timeline, drawn: lanes of spans, checkpoint and restart marks, as one inline SVG.

Pure: no I/O, no clock. The offline room builds a ``Timeline`` from a journal next to the engine
(``nvrx_slo.exporter.offline.timeline_builder``); ``render_svg`` draws it and ``legend_html`` explains it.

Why it is bounded: a month-long journal holds millions of steps. Consecutive spans of one kind
closer than ``MERGE_PX`` pixels are merged into a run (so a lane never holds more spans per kind
than the plot has pixels / ``MERGE_PX``), at most ``MAX_LANES`` ranks are drawn, and only the
newest ``MAX_MARKERS`` checkpoints and restarts are marked; what was left out is counted and
said on the picture.

Every string from the journal (ids, causes, pod names) is escaped with ``html.escape`` where it
is written into the SVG.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

PLOT_WIDTH = 1100  # px of the time axis
MERGE_PX = 2  # spans of one kind closer than this are drawn as one run
GUTTER = 90  # px left of the plot for lane labels
MAX_LANES = 64
MAX_MARKERS = 400

# Bar kinds, in drawing order (later ones on top); each has a CSS class "tl-<kind>".
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
class Bar:
    """``[start, end]`` in seconds since the timeline's origin; ``count`` spans merged into it."""

    kind: str
    start: float
    end: float
    count: int
    label: str


@dataclass(frozen=True)
class Row:
    rank: int
    bars: tuple[Bar, ...]
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
    lanes: tuple[Row, ...]
    checkpoints: tuple[CheckpointMarker, ...]
    restarts: tuple[RestartBand, ...]
    lanes_omitted: int = 0
    checkpoints_omitted: int = 0
    restarts_omitted: int = 0

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
        for sp in lane.bars:
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
