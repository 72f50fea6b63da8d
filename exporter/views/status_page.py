"""The sidecar's status page: one ``View`` (engine snapshot + reader counters) as a self-contained page.

What a person port-forwarding to a sidecar wants first: is the job meeting its efficiency SLO,
where did the rest of the time go, did the last checkpoints overlap training, how long did the
restarts take and in which phase. Everything is in the page itself — the stylesheet is inlined,
charts are inline SVG, nothing is fetched — so it works air-gapped, and it reloads itself.

Key numbers carry stable ids and a ``data-value`` holding the raw number (seconds, ratios) so
tests and scripts read them without parsing display text. Every string from the journal (job,
pod, checkpoint ids, causes) goes through ``html.escape``.

It renders the same ``View`` (``nvrx_slo.exporter.views.view``) as /metrics and OTLP, so the numbers agree by
construction. The offline report (``exporter/offline/report.py``) reuses ``sections`` and ``page`` around a
timeline.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass
from importlib import resources

from nvrx_slo.contracts.catalogue import Category, RestartLevel, RestartPhase, StepTimer
from nvrx_slo.contracts.targets import Targets
from nvrx_slo.exporter.engine.snapshot import RankSnapshot, RankState, Snapshot
from nvrx_slo.exporter.views.judgement import breakdown, slo_results
from nvrx_slo.exporter.views.view import View

REFRESH_S = 5
MAX_RANK_BARS = 16  # per-rank breakdown bars; beyond this only the job bar is drawn
MAX_RANK_ROWS = 64  # per-rank table rows
RECENT_ROWS = 10  # the newest saves and restarts listed


@dataclass(frozen=True)
class CategoryStyle:
    label: str
    colour: str  # CSS colour of its bar segments, swatches and timeline spans


# Every category, keyed by the one list of them: the pages draw each with its colour, and a
# category added to the catalogue without one fails every page render (``category_css``).
CATEGORY_STYLES: dict[Category, CategoryStyle] = {
    Category.PRODUCTIVE: CategoryStyle("productive", "#2e7d32"),
    Category.UNPROTECTED: CategoryStyle("unprotected (not yet checkpointed)", "#81c784"),
    Category.LOST: CategoryStyle("lost (rolled back)", "#e53935"),
    Category.CHECKPOINT_BLOCKING: CategoryStyle("checkpoint blocking", "#fb8c00"),
    Category.CHECKPOINT_RESTORE: CategoryStyle("checkpoint restore", "#8e24aa"),
    Category.RESTART: CategoryStyle("restart", "#6d4c41"),
    Category.INIT: CategoryStyle("init", "#90a4ae"),
    Category.SHUTDOWN: CategoryStyle("shutdown", "#546e7a"),
    Category.DATA_WAIT: CategoryStyle("data wait", "#42a5f5"),
    Category.USER_SPAN: CategoryStyle("user spans (eval, …)", "#00acc1"),
    Category.UNATTRIBUTED: CategoryStyle("unattributed", "#bdbdbd"),
    Category.ABSENT: CategoryStyle("absent (no pod ran the rank)", "#f48fb1"),
}


def category_css() -> str:
    """Each category's colour as ``--<category>`` (the timeline's stylesheet uses them) and its
    ``.c-<category>`` class for bar segments and swatches; ``KeyError`` for a category without one."""
    colours = "".join(f"--{c.value}: {CATEGORY_STYLES[c].colour}; " for c in Category)
    classes = "".join(f".c-{c.value} {{ fill: var(--{c.value}); background: var(--{c.value}); }}\n"
                      for c in Category)
    return f":root {{ {colours}}}\n{classes}"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _pct(ratio: float | None, digits: int = 2) -> str:
    return "—" if ratio is None else f"{100 * ratio:.{digits}f}%"


def _secs(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 2 * 86400:
        return f"{value / 86400:.1f} d"
    if value >= 3600:
        return f"{value / 3600:.2f} h"
    if value >= 120:
        return f"{value / 60:.1f} min"
    return f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def _when(wall: float | None, now_wall: float) -> str:
    if wall is None:
        return "—"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall))
    return f'{stamp} <span class="sub">({_secs(max(0.0, now_wall - wall))} ago)</span>'


def _num(id_: str, value: float | int | None, text: str, cls: str = "") -> str:
    """A number with a stable id and its raw value; ``data-value`` is empty when unknown."""
    raw = "" if value is None else repr(float(value)) if isinstance(value, float) else str(value)
    return f'<span id="{_e(id_)}" class="{cls}" data-value="{raw}">{_e(text)}</span>'


def _verdict(ok: bool | None) -> str:
    cls, text = ("na", "no data") if ok is None else ("pass", "PASS") if ok else ("fail", "FAIL")
    return f'<span class="badge {cls}">{text}</span>'


# --- sections ----------------------------------------------------------------------------------

def _rank_name(r: RankSnapshot) -> str:
    """``rank 1``, and in a job the pod that ran it: a lost pod's rank and its replacement's are two."""
    if not r.pod:
        return f"rank {r.rank}"
    return f"rank {r.rank} · {r.pod}" + (" (lost)" if r.state is RankState.LOST else "")


def _bar_svg(parts: dict[Category, float], label: str, y: int, gutter: float) -> str:
    total = sum(parts.values())
    out = [f'<text x="0" y="{y + 15}">{_e(label)}</text>']
    x = gutter
    width = 990.0 - gutter
    for cat, value in parts.items():
        if total <= 0 or value <= 0:
            continue
        w = width * value / total
        title = f"{CATEGORY_STYLES[cat].label}: {_secs(value)} ({_pct(value / total)})"
        out.append(f'<rect class="seg c-{cat.value}" x="{x:.2f}" y="{y}" width="{w:.2f}" height="20">'
                   f"<title>{_e(title)}</title></rect>")
        x += w
    return "".join(out)


def _time_section(snap: Snapshot) -> str:
    parts = breakdown(snap)
    wall = snap.wall_s
    ranks = snap.ranks if len(snap.ranks) <= MAX_RANK_BARS else ()
    gutter = min(400.0, max([110.0] + [7.0 * len(_rank_name(r)) for r in ranks]))  # ~7 px a character
    bars = [_bar_svg(parts, "job", 4, gutter)]
    for i, r in enumerate(ranks):
        rp = {c: (r.unprotected_s if c is Category.UNPROTECTED else r.seconds.get(c, 0.0)) for c in Category}
        bars.append(_bar_svg(rp, _rank_name(r), 34 + 26 * i, gutter))
    height = 34 + 26 * len(ranks)
    rows = []
    for cat, value in parts.items():
        share = value / wall if wall > 0 else None
        rows.append(f'<tr data-category="{cat.value}">'
                    f'<td><span class="swatch c-{cat.value}"></span>{_e(CATEGORY_STYLES[cat].label)}</td>'
                    f'<td class="num">{_num(f"seconds-{cat.value}", value, _secs(value))}</td>'
                    f'<td class="num">{_num(f"share-{cat.value}", share, _pct(share))}</td></tr>')
    rows.append(f'<tr><th>wall (rank-seconds)</th><th class="num">{_num("wall-seconds", wall, _secs(wall))}</th>'
                f'<th class="num">100%</th></tr>')
    return (f'<section class="card wide"><h2>Where the time went</h2>'
            f'<svg class="breakdown" viewBox="0 0 1000 {height}" width="100%" role="img" '
            f'aria-label="time by category">{"".join(bars)}</svg>'
            f'<table class="split"><tr><th>category</th><th class="num">rank-seconds</th>'
            f'<th class="num">share of wall</th></tr>'
            f'{"".join(rows)}</table></section>')


def _headline(snap: Snapshot, targets: Targets) -> str:
    eff = snap.efficiency
    ok = slo_results(snap, targets)[0].ok
    cls = "na" if ok is None else "pass" if ok else "fail"
    steps = sum(r.steps for r in snap.ranks)
    step, restarts, ranks = snap.latest_step, snap.restarts_total, snap.rank_count
    return (f'<section class="card"><h2>Training efficiency</h2>'
            f'<div class="big {cls}">{_num("efficiency", eff, _pct(eff))}</div>'
            f'<div class="sub">SLO ≥ {_pct(targets.efficiency, 0)} {_verdict(ok)} · predicted (ETTR) '
            f'{_num("predicted-efficiency", snap.predicted_efficiency, _pct(snap.predicted_efficiency))}</div>'
            f'<table><tr><td>ranks</td><td class="num">{_num("ranks", ranks, str(ranks))}</td></tr>'
            f'<tr><td>latest step</td>'
            f'<td class="num">{_num("step", step, "—" if step is None else str(step))}</td></tr>'
            f'<tr><td>steps run (all ranks, rolled back included)</td>'
            f'<td class="num">{_num("steps-total", steps, str(steps))}</td></tr>'
            f'<tr><td>restarts</td><td class="num">{_num("restarts-total", restarts, str(restarts))}</td></tr>'
            f'<tr><td>job started</td><td class="num">{_when(snap.job_start_wall, snap.now_wall)}</td></tr>'
            f'<tr><td>state</td><td class="num">{_e(snap.state)}</td></tr>'
            f"</table></section>")


def _slo_section(snap: Snapshot, targets: Targets) -> str:
    rows = "".join(
        f'<tr id="slo-{r.key}" data-ok="{"" if r.ok is None else str(r.ok).lower()}"><td>{_e(r.name)}</td>'
        f"<td>{_e(r.objective)}</td><td class=\"num\">{_num(f'slo-{r.key}-value', r.value, r.shown)}</td>"
        f"<td>{_verdict(r.ok)}</td></tr>"
        for r in slo_results(snap, targets))
    return (f'<section class="card"><h2>SLOs (whole job so far)</h2><table>'
            f'<tr><th>SLO</th><th>objective</th><th class="num">now</th><th></th></tr>{rows}</table></section>')


def _checkpoint_section(snap: Snapshot) -> str:
    ck = snap.checkpoints
    # a worker shut down with its rank (or lost with its pod) is not news: only live ranks' workers are judged
    workers = [r.worker_alive for r in snap.ranks
               if r.worker_alive is not None and r.state not in (RankState.ENDED, RankState.LOST)]
    worker = "—" if not workers else "alive" if all(workers) else f"DEAD on {workers.count(False)} rank(s)"
    head = (f'<table><tr><td>durable saves</td><td class="num">{_num("checkpoint-saves", ck.saves, str(ck.saves))}</td>'
            f'<td>failed</td><td class="num">{_num("checkpoint-failures", ck.failures, str(ck.failures))}</td>'
            f'<td>in flight</td>'
            f'<td class="num">{_num("checkpoint-in-flight", ck.in_flight, str(ck.in_flight))}</td></tr>'
            f'<tr><td>overlap</td>'
            f'<td class="num">{_num("checkpoint-overlap", ck.overlap_ratio, _pct(ck.overlap_ratio, 1))}</td>'
            f'<td>blocking share</td><td class="num">'
            f'{_num("checkpoint-blocking-fraction", ck.blocking_fraction, _pct(ck.blocking_fraction, 3))}</td>'
            f'<td>age</td><td class="num">{_num("checkpoint-age", ck.age_s, _secs(ck.age_s))}</td></tr>'
            f'<tr><td>interval</td><td class="num">{_secs(ck.interval_s)}</td>'
            f'<td>Young/Daly optimum</td><td class="num">{_secs(ck.optimal_interval_s)}</td>'
            f'<td>async worker</td><td class="num">{_e(worker)}</td></tr></table>')
    rows = []
    for c in reversed(ck.recent[-RECENT_ROWS:]):
        blk, bg = c.blocking_s or 0.0, c.background_s or 0.0
        total = blk + bg
        bar = (f'<div class="bar" title="blocking vs background">'
               f'<span class="blk" style="width:{100 * blk / total:.1f}%"></span>'
               f'<span class="bg" style="width:{100 * bg / total:.1f}%"></span></div>') if total > 0 else ""
        status = "unfinished" if c.ok is None else "durable" if c.ok else "FAILED"
        rows.append(f'<tr data-ckpt="{_e(c.ckpt)}"><td class="cause">{_e(c.ckpt)}</td><td class="num">{c.step}</td>'
                    f'<td>{_e(c.mode)}</td><td class="num">{_secs(c.blocking_s)}</td>'
                    f'<td class="num">{_secs(c.background_s)}</td>'
                    f'<td>{bar}</td><td class="{"na" if c.ok is None else "pass" if c.ok else "fail"}">{status}</td>'
                    f"<td>{_when(c.written_wall, snap.now_wall)}</td></tr>")
    table = (f'<table><tr><th>checkpoint</th><th class="num">step</th><th>mode</th><th class="num">blocking</th>'
             f'<th class="num">background</th><th><span class="swatch c-checkpoint_blocking"></span>blocking vs '
             f'<span class="swatch" style="background:var(--background)"></span>background</th>'
             f'<th>status</th><th>written</th></tr>'
             f'{"".join(rows)}</table>') if rows else '<p class="sub">No checkpoint yet.</p>'
    return f'<section class="card wide"><h2>Checkpoints</h2>{head}<h2>Latest saves</h2>{table}</section>'


def _restart_section(snap: Snapshot, targets: Targets) -> str:
    rs = snap.restarts
    counts = " · ".join(f'{lvl.value} {_num(f"restarts-{lvl.value}", n, str(n))}'
                        for lvl, n in ((lvl, rs.counts.get(lvl, 0)) for lvl in RestartLevel))
    rows = []
    for r in reversed(rs.recent[-RECENT_ROWS:]):
        total = sum(r.phases.values())
        segs = "".join(f'<span class="phase-{p.value}" style="width:{100 * r.phases[p] / total:.1f}%" '
                       f'title="{_e(p.value)}: {_secs(r.phases[p])}"></span>'
                       for p in RestartPhase if p in r.phases and total > 0)
        detail = ", ".join(f"{p.value} {_secs(r.phases[p])}" for p in RestartPhase if p in r.phases)
        slow = r.duration_s is not None and r.duration_s >= targets.recovery_threshold_s
        took = "in progress" if r.duration_s is None else _secs(r.duration_s)
        rows.append(f'<tr data-level="{_e(r.level.value)}"><td>{_when(r.fault_wall, snap.now_wall)}</td>'
                    f'<td>{_e(r.level.value)}</td><td class="num {"fail" if slow else ""}">{took}</td>'
                    f'<td><div class="bar">{segs}</div><span class="sub">{_e(detail)}</span></td>'
                    f'<td class="cause">{_e(r.cause or "—")}</td></tr>')
    table = ('<table><tr><th>fault</th><th>level</th><th class="num">back in</th><th>phases</th><th>cause</th></tr>'
             f'{"".join(rows)}</table>') if rows else '<p class="sub">No restart.</p>'
    legend = " ".join(f'<span class="swatch phase-{p.value}"></span>{p.value}' for p in RestartPhase)
    return (f'<section class="card wide"><h2>Restarts</h2><p>{counts} · MTBF '
            f'{_num("mtbf", rs.mtbf_s, _secs(rs.mtbf_s))}</p><p class="sub">{legend}</p>{table}</section>')


_TIMER_LABEL = {StepTimer.CUDA: "CUDA events", StepTimer.HOST: "host clocks",
                StepTimer.HOST_ON_GPU: "HOST CLOCKS on a GPU"}
# host clocks on a GPU time kernel launches: its phases are misbooked, and that shows
_TIMER_CLASS: dict[StepTimer | None, str] = {StepTimer.HOST_ON_GPU: "fail"}


def _timer(timer: StepTimer | None) -> str:
    return "—" if timer is None else _TIMER_LABEL[timer]


def step_timing(snap: Snapshot) -> str:
    """How the ranks' steps are timed, in one line: ``CUDA events on 2 rank(s)``."""
    timers = [r.step_timer for r in snap.ranks]
    return ", ".join(f"{_timer(t) if t else 'not journaled'} on {timers.count(t)} rank(s)"
                     for t in dict.fromkeys(timers)) or "no rank yet"


def _ranks_section(snap: Snapshot) -> str:
    rows = []
    job = any(r.pod for r in snap.ranks)  # a job's ranks: each with the pod that ran it
    for r in snap.ranks[:MAX_RANK_ROWS]:
        eff = r.efficiency
        worker = ("—" if r.worker_alive is None else "alive" if r.worker_alive
                  else "stopped" if r.state is RankState.ENDED else "lost" if r.state is RankState.LOST else "DEAD")
        pod = f"<td>{_e(r.pod)}</td>" if job else ""
        rows.append(f'<tr data-rank="{r.rank}" data-pod="{_e(r.pod)}"><td>{r.rank}</td>{pod}'
                    f'<td>{_e(r.state.value)}</td>'
                    f'<td class="num">{"—" if r.step is None else r.step}</td><td class="num">{_pct(eff)}</td>'
                    f'<td class="num">{_secs(r.unprotected_s)}</td>'
                    f'<td class="num">{"—" if r.skew_ratio is None else f"{r.skew_ratio:.2f}"}</td>'
                    f'<td>{worker}</td><td class="{_TIMER_CLASS.get(r.step_timer, "")}">{_timer(r.step_timer)}</td>'
                    f'<td class="num">{_secs(r.gpu_idle_s)}</td>'
                    f'<td class="num">{r.restart}/{r.iter}</td><td>{_when(r.last_step_wall, snap.now_wall)}</td></tr>')
    more = (f'<p class="sub">{len(snap.ranks) - MAX_RANK_ROWS} more ranks not listed.</p>'
            if len(snap.ranks) > MAX_RANK_ROWS else "")
    return ('<section class="card wide"><h2>Ranks</h2><table><tr><th>rank</th>'
            f'{"<th>pod</th>" if job else ""}<th>state</th><th class="num">step</th>'
            '<th class="num">efficiency</th><th class="num">unprotected</th><th class="num">step-time skew</th>'
            '<th>ckpt worker</th><th>step timing</th><th class="num">accel. idle</th><th class="num">restart/iter</th>'
            '<th>last step</th></tr>'
            f'{"".join(rows)}</table>{more}</section>')


def _exporter_section(view: View) -> str:
    rejected = sum(view.rejected.values())
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(view.rejected.items()) if n) or "none"
    pod = ", ".join(f"{c} ({r}) {n}" for (c, r), n in sorted(view.pod_restarts.items())) or "none seen"
    snap = view.snapshot
    return (f'<section class="card wide"><h2>Exporter</h2><table>'
            f'<tr><td>journal events accepted</td>'
            f'<td class="num">{_num("events-accepted", snap.events_accepted, str(snap.events_accepted))}</td></tr>'
            f'<tr><td>journal lines rejected</td><td class="num {"fail" if rejected else ""}">'
            f'{_num("rejected", rejected, str(rejected))}</td><td>{_e(reasons)}</td></tr>'
            f'<tr><td>journal lag</td><td class="num">{_secs(snap.journal_lag_s)}</td></tr>'
            f"<tr><td>container restarts (pod watcher)</td><td></td><td>{_e(pod)}</td></tr></table></section>")


def sections(view: View, targets: Targets) -> str:
    """The page body: every card, in reading order."""
    snap = view.snapshot
    return (f'<div class="grid">{_headline(snap, targets)}{_slo_section(snap, targets)}{_time_section(snap)}'
            f"{_checkpoint_section(snap)}{_restart_section(snap, targets)}{_ranks_section(snap)}"
            f"{_exporter_section(view)}</div>")


def page(title: str, snap: Snapshot, body: str, *, refresh_s: int | None, links: str) -> str:
    """A whole HTML document with the stylesheet inlined."""
    css = resources.files("nvrx_slo.exporter.views").joinpath("templates/style.css").read_text(encoding="utf-8")
    css += category_css()
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    ident = " · ".join(f"{k} <b>{_e(v)}</b>" for k,
                       v in (("job", snap.job), ("pod", snap.pod), ("node", snap.node)) if v)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(snap.now_wall))
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">{refresh}'
            f"<title>{_e(title)}</title><style>{css}</style></head><body>"
            f'<header><h1>{_e(title)}</h1><span class="ident">{ident}</span>'
            f'<span class="ident" id="generated" data-value="{snap.now_wall!r}">as of {stamp}</span>{links}</header>'
            f"<main>{body}</main>"
            f"<footer>Time is in rank-seconds: N ranks accrue N seconds per second of wall clock. "
            f"Job-level numbers sum over ranks.</footer></body></html>")


def render(view: View, targets: Targets) -> str:
    """The live page served at ``/``."""
    links = ('<span class="ident"><a href="metrics">/metrics</a> · <a href="healthz">/healthz</a> · '
             f"refreshes every {REFRESH_S} s</span>")
    return page("nvrx-slo status", view.snapshot, sections(view, targets), refresh_s=REFRESH_S, links=links)
