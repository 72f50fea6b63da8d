"""The text SLO report the demo prints: one snapshot, read by a person at a terminal.

Efficiency, where every rank-second went (productive plus each badput category, summing to 100%
of wall — the engine's invariant), what badput cost (``cost``), checkpoint overlap and blocking
share, restart latency by level and by phase, and the spec's SLOs judged pass/fail. Journal strings (job, pod, causes)
are escaped for the terminal (``printable``). The SLO judgement and the split of
the time are ``judgement``'s, as the status page's are, so the page and the report never disagree.
"""

from __future__ import annotations

from nvrx_slo.contracts.catalogue import Category, RestartLevel, RestartPhase
from nvrx_slo.contracts.targets import Targets
from nvrx_slo.exporter.engine.snapshot import Snapshot
from nvrx_slo.exporter.printable import printable
from nvrx_slo.exporter.views import cost
from nvrx_slo.exporter.views.judgement import breakdown, slo_results
from nvrx_slo.exporter.views.status_page import CATEGORY_STYLES, RECENT_ROWS, step_timing


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:6.2f}%" if whole > 0 else "     —"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}%"


def _secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _scope(pods: str) -> str:
    """``pod a`` for a pod's snapshot; ``2 pods (a, b)`` for a job's (``job.job_snapshot``)."""
    names = [printable(name) for name in pods.split(", ")] if pods else ["?"]
    return f"pod {names[0]}" if len(names) == 1 else f"{len(names)} pods ({', '.join(names)})"


def render(snap: Snapshot, targets: Targets, pricing: cost.Pricing | None = None) -> str:
    """``pricing``: how badput is priced (default: the spec's price, one accelerator per rank)."""
    wall = snap.wall_s
    lines = [
        f"nvrx-slo SLO report — job {printable(snap.job) or '?'}, {_scope(snap.pod)}, "
        f"{snap.rank_count} rank(s), {printable(snap.state)}",
        "",
        f"Efficiency (productive / wall): {_ratio(snap.efficiency)}",
        "",
        f"Where the time went ({wall:.{1 if wall >= 10 else 2}f} rank-seconds of wall):",  # a toy run: not 0.0
    ]
    parts = breakdown(snap)
    width = max(len(style.label) for style in CATEGORY_STYLES.values())
    for category, seconds in sorted(parts.items(), key=lambda kv: (kv[0] is not Category.PRODUCTIVE, -kv[1])):
        lines.append(f"  {CATEGORY_STYLES[category].label:<{width}}  {seconds:10.2f} s  {_pct(seconds, wall)}")
    lines.append(f"  {'total':<{width}}  {sum(parts.values()):10.2f} s  {_pct(sum(parts.values()), wall)}")
    lines.append(f"  steps timed by {step_timing(snap)}")
    lines += ["", *cost.text(cost.table(snap, pricing or cost.Pricing.of(None, targets), targets))]

    ck = snap.checkpoints
    lines += [
        "",
        f"Checkpoints: {ck.saves} durable, {ck.failures} failed, {ck.in_flight} in flight; "
        f"overlap {_ratio(ck.overlap_ratio)} (background / (blocking + background)); "
        f"blocking {_ratio(ck.blocking_fraction)} of wall",
    ]
    if ck.recent:
        older = "; older not shown" if len(ck.recent) > RECENT_ROWS else ""
        lines.append(f"  latest saves (slowest rank), oldest first{older}:")
        width = max(len(printable(c.ckpt)) for c in ck.recent[-RECENT_ROWS:])
        for c in ck.recent[-RECENT_ROWS:]:
            status = "in flight or unfinished" if c.ok is None else "durable" if c.ok else "FAILED"
            lines.append(f"    {printable(c.ckpt):<{width}}  step {c.step:<6}  blocking {_secs(c.blocking_s):>8}  "
                         f"background {_secs(c.background_s):>8}  {status}")
    lines += [
        "",
        "Restart latency (fault to the first step of the restarted loop):",
    ]
    rs = snap.restarts
    phases_width = max(len(p.value) for p in RestartPhase)
    for level in RestartLevel:
        hist = rs.duration[level]
        if not hist.count:
            lines.append(f"  {level.value:<9} none")
            continue
        lines.append(f"  {level.value:<9} {hist.count} restart(s), mean {_secs(hist.mean)}")
        for phase in RestartPhase:
            ph = rs.phases[(level, phase)]
            if ph.count:
                lines.append(f"    {phase.value:<{phases_width}}  mean {_secs(ph.mean)} over {ph.count}")
    if rs.recent:
        lines.append("  most recent:")
        for r in rs.recent[-5:]:
            phases = ", ".join(f"{p.value} {v:.2f} s" for p, v in r.phases.items())
            lines.append(f"    {r.level.value:<9} {_secs(r.duration_s):>9}  {r.fault.value}: "
                         f"{printable(r.cause or '?')}{'  (' + phases + ')' if phases else ''}")
    lines.append(f"  MTBF {_secs(rs.mtbf_s)}")

    lines += ["", "SLOs (whole run so far):"]
    for result in slo_results(snap, targets):
        verdict = "no data" if result.ok is None else "PASS" if result.ok else "FAIL"
        lines.append(f"  {verdict:<7}  {result.name}: {result.shown}  (objective: {result.objective})")
    return "\n".join(lines) + "\n"
