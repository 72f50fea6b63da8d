"""``nvrx-slo report JOURNAL_DIR``: the status page's accounting, offline, plus a timeline.

For the engineer who copied a journal off a node after the fact, or wants one file to attach to
an incident ticket. The journal is read by the one replay (``nvrx_slo.exporter.offline.replay``:
exactly as the sidecar reads it, into the same ``Engine``, as of its newest record); the page
reuses the status page's sections and adds the timeline (``exporter/views/timeline.py``). One
self-contained HTML file: stylesheet inlined, inline SVG, no script.

Everything the timeline marks that the engine decides — each step's fate, every save and every
restart — comes from the engine, made with ``keep_history=True`` (its step verdicts as it makes
them, ``Engine.history`` at the end), so the picture and the numbers beside it agree by
construction. The engine's phases are consecutive stretches from the fault that sum to the
restart's duration, so they are laid end to end.
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from nvrx_slo.contracts.catalogue import RestartPhase
from nvrx_slo.contracts.targets import Targets
from nvrx_slo.exporter.engine.engine import History
from nvrx_slo.exporter.engine.snapshot import RestartRecord, Snapshot
from nvrx_slo.exporter.offline import rollup
from nvrx_slo.exporter.offline.replay import EmptyJournal, Replay
from nvrx_slo.exporter.offline.timeline_builder import TimelineBuilder, compose
from nvrx_slo.exporter.views import cost, slo_report, status_page, timeline
from nvrx_slo.exporter.views.timeline import RestartBand
from nvrx_slo.exporter.views.view import View

FORMATS = {"html": "report.html", "text": "-", "csv": "-"}  # each format's default output (-: stdout)


def _band(r: RestartRecord, now_wall: float) -> RestartBand:
    end = r.fault_wall + r.duration_s if r.duration_s is not None else now_wall
    phases, t = [], r.fault_wall
    for phase in RestartPhase:
        if phase in r.phases:
            phases.append((phase.value, t, t + r.phases[phase]))
            t += r.phases[phase]
    return RestartBand(r.level.value, r.fault_wall, max(end, t), tuple(phases), r.cause)


@dataclasses.dataclass(frozen=True)
class _Pod:
    """One journal directory, replayed: its engine's snapshot and history, its timeline's builder."""

    snap: Snapshot
    history: History
    builder: TimelineBuilder
    rejected: dict[str, int]


def _read(journal_dir: str | Path) -> _Pod:
    builder = TimelineBuilder()
    with Replay(journal_dir, builder=builder) as replay:
        replay.read_all()
    if not replay.tail.directory_ok:
        raise FileNotFoundError(f"cannot read journal directory {journal_dir}")
    snap = replay.view().snapshot
    return _Pod(snap, replay.engine.history(), builder, dict(replay.tail.rejected))


@dataclasses.dataclass(frozen=True)
class _Replayed:
    """The journal directories replayed: one pod's accounting, or its job's (``exporter/offline/rollup.py``)."""

    pods: list[_Pod]
    snap: Snapshot
    view: View

    def timeline(self) -> timeline.Timeline:
        restarts = [_band(r, self.snap.now_wall) for r in self.snap.restarts.recent]
        if len(self.pods) == 1:
            return self.pods[0].builder.build(restarts, self.snap.checkpoints.recent)
        return compose([(p.snap.pod, p.builder) for p in self.pods], restarts, self.snap.checkpoints.recent)


def _replay(journal_dirs: Sequence[str | Path]) -> _Replayed:
    # every restart and save of each pod's full history, not only each snapshot's newest
    pods = sorted((_read(d) for d in journal_dirs), key=lambda p: p.snap.job_start_wall or 0.0)
    full = [dataclasses.replace(p.snap, restarts=dataclasses.replace(p.snap.restarts, recent=p.history.restarts),
                                checkpoints=dataclasses.replace(p.snap.checkpoints, recent=p.history.checkpoints))
            for p in pods]
    snap = full[0] if len(full) == 1 else rollup.job_snapshot(full, lost=rollup.lost_pods(full))
    rejected = dict(sum((Counter(p.rejected) for p in pods), Counter()))
    view = View.of(snap, rejected)
    return _Replayed(pods, snap, view)


def build(journal_dirs: Sequence[str | Path], targets: Targets, pricing: cost.Pricing | None = None) -> str:
    """The report of one pod's journal directory, or of a job's (one directory per pod: the job's
    accounting, ``exporter/offline/rollup.py``, and one timeline with every pod's lanes), as one HTML
    document, its SLOs judged against ``targets``; ``EmptyJournal`` if a directory holds nothing."""
    replayed = _replay(journal_dirs)
    view, snap = replayed.view, replayed.snap
    bad = sum(view.rejected.values())
    warning = (f'<p class="fail">{bad} journal lines were rejected and not accounted '
               f"(see Exporter below).</p>") if bad else ""
    several = len(replayed.pods) > 1
    lanes = "One lane per rank" + (" and pod" if several else "")
    body = (f'<div class="grid"><section class="card wide"><h2>Timeline</h2>{warning}'
            f"{timeline.legend_html()}{timeline.render_svg(replayed.timeline())}"
            f'<p class="sub">{lanes}; hover a span for details. Restarts and their phases run '
            f"across all lanes; lost work is the training that a restart rolled back.</p></section></div>"
            f"{status_page.sections(view, targets)}"
            f'<div class="grid">{cost.html(cost.table(snap, pricing or cost.Pricing.of(None, targets), targets))}'
            "</div>")
    made = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    what = f"{len(replayed.pods)} journals" if several else "journal"
    links = (f'<span class="ident">{what} <b>{html.escape(", ".join(map(str, journal_dirs)))}</b> · '
             f"report made {made}</span>")
    return status_page.page("nvrx-slo report", snap, body, refresh_s=None, links=links)


def text(journal_dirs: Sequence[str | Path], targets: Targets, pricing: cost.Pricing | None = None) -> str:
    """The same accounting as ``build``, as the text SLO report the sidecar writes (no timeline)."""
    return slo_report.render(_replay(journal_dirs).snap, targets, pricing)


def cost_csv(journal_dirs: Sequence[str | Path], targets: Targets, pricing: cost.Pricing | None = None) -> str:
    """The report's cost table as CSV (``views/cost.py``)."""
    snap = _replay(journal_dirs).snap
    return cost.to_csv(cost.table(snap, pricing or cost.Pricing.of(None, targets), targets), snap)


def write(journal_dirs: Sequence[str | Path], output: str | Path, targets: Targets) -> Path:
    """Build the report of ``journal_dirs`` and write it to ``output``; returns its absolute path."""
    document = build(journal_dirs, targets)
    path = Path(output).resolve()
    path.write_text(document, encoding="utf-8")
    return path


def parser() -> argparse.ArgumentParser:
    """The command's flags (``tests/test_cli.py`` freezes them)."""
    parser = argparse.ArgumentParser(prog="nvrx-slo report", description=__doc__.split("\n")[0])
    parser.add_argument("journal_dirs", metavar="JOURNAL_DIR", type=Path, nargs="+",
                        help="a pod's journal directory; several: one job, a directory per pod (a lost "
                             "pod's and its replacement's included)")
    parser.add_argument("--format", choices=FORMATS, default="html",
                        help="html: the page with a timeline; text: the SLO report the sidecar writes; csv: the "
                             "cost table, FinOps FOCUS columns where one fits (default: html)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help=f"where to write it, - for stdout (default: {FORMATS['html']} for html, "
                             f"{FORMATS['text']} for text and csv)")
    parser.add_argument("--price", type=_price, metavar="PRICE",
                        help="what one accelerator-hour costs, in the SLO spec's currency (default: the spec's "
                             "cost.accelerator_hour.default); a rank holds one accelerator")
    return parser


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, not {text!r}") from None
    if not 0 <= value < 1e6:
        raise argparse.ArgumentTypeError(f"must be from 0 to 1e6 per accelerator-hour, not {text}")
    return value


def main(argv: list[str], targets: Targets) -> int:
    """``nvrx-slo report``; ``targets`` come from the SLO spec (``nvrx_slo/cli.py`` loads it)."""
    cli = parser()
    args = cli.parse_args(argv)
    for journal_dir in args.journal_dirs:
        if not journal_dir.is_dir():
            cli.error(f"JOURNAL_DIR {journal_dir}: not a directory")
    if len(set(map(Path.resolve, args.journal_dirs))) < len(args.journal_dirs):
        cli.error("JOURNAL_DIR: a directory is named twice (each pod's journal once)")
    output = args.output or FORMATS[args.format]
    render = {"html": build, "text": text, "csv": cost_csv}[args.format]
    try:
        document = render(args.journal_dirs, targets, cost.Pricing.of(args.price, targets))
    except (EmptyJournal, FileNotFoundError) as exc:
        print(f"nvrx-slo report: {exc}", file=sys.stderr)
        return 1
    if output == "-":
        sys.stdout.write(document)
        return 0
    path = Path(output).resolve()
    try:
        path.write_text(document, encoding="utf-8")
    except OSError as exc:
        print(f"nvrx-slo report: cannot write {output}: {exc.strerror}", file=sys.stderr)
        return 1
    print(path)
    return 0
