"""``nvrx-slo report JOURNAL_DIR -o report.html``: the status page's accounting, offline, plus a timeline.

For the engineer who copied a journal off a node after the fact, or wants one file to attach to
an incident ticket. The journal is read exactly as the sidecar reads it (``JournalTail``: same
decoding, same merge by time, same rejections) into the same ``Engine``; the page reuses the
status page's sections and adds the timeline (``exporter/timeline.py``). One self-contained
HTML file: stylesheet inlined, inline SVG, no script.

"Now" for an offline journal is its newest event, so a journal that ends mid-run (the node died)
is accounted up to its last word, not up to the moment the report was made.

Everything the timeline marks that the engine decides — each step's fate, every save and every
restart — comes from the engine, made with ``keep_history=True`` (``Engine.take_verdicts`` after
each batch of records, ``Engine.history`` at the end), so the picture and the numbers beside it
agree by construction. The engine's phases are consecutive stretches from the fault that sum to
the restart's duration, so they are laid end to end.
"""

from __future__ import annotations

import argparse
import html
import sys
import time
from pathlib import Path

from nvrx_slo.contracts.catalogue import RestartPhase
from nvrx_slo.contracts.targets import Targets
from nvrx_slo.exporter import status_page, timeline
from nvrx_slo.exporter.decode import Event
from nvrx_slo.exporter.engine import Engine
from nvrx_slo.exporter.live import DUPLICATE, IMPLAUSIBLE, LATE, View
from nvrx_slo.exporter.snapshot import RestartRecord
from nvrx_slo.exporter.tail import JournalTail
from nvrx_slo.exporter.timeline import RestartBand, TimelineBuilder


class EmptyJournal(ValueError):
    """The directory holds no accepted journal event."""


def _band(r: RestartRecord, now_wall: float) -> RestartBand:
    end = r.fault_wall + r.duration_s if r.duration_s is not None else now_wall
    phases, t = [], r.fault_wall
    for phase in RestartPhase:
        if phase in r.phases:
            phases.append((phase.value, t, t + r.phases[phase]))
            t += r.phases[phase]
    return RestartBand(r.level.value, r.fault_wall, max(end, t), tuple(phases), r.cause)


class _Replay:
    """Feed records to the engine and the timeline builder, and the engine's step verdicts to the builder."""

    def __init__(self) -> None:
        self.engine = Engine(keep_history=True)
        self.builder = TimelineBuilder()
        self.newest: tuple[float, float] | None = None  # (mono, wall) of the newest event

    def ingest(self, records: list[Event]) -> None:
        for record in records:
            self.engine.ingest(record)
            self.builder.add(record)
            if self.newest is None or record.mono > self.newest[0]:
                self.newest = (record.mono, record.wall)
        self.builder.decide(self.engine.take_verdicts())


def build(journal_dir: str | Path, targets: Targets) -> str:
    """The report of ``journal_dir`` as one HTML document, its SLOs judged against ``targets``;
    ``EmptyJournal`` if nothing was accepted."""
    tail = JournalTail(journal_dir)
    replay = _Replay()
    try:
        tail.poll(replay.ingest)
    finally:
        tail.close()
    if not tail.directory_ok:
        raise FileNotFoundError(f"cannot read journal directory {journal_dir}")
    if replay.newest is None:
        raise EmptyJournal(f"no journal events in {journal_dir}"
                           + (f" ({sum(tail.rejected.values())} lines rejected)" if tail.rejected else ""))
    snap = replay.engine.snapshot(*replay.newest)
    replay.builder.decide(replay.engine.take_verdicts())
    history = replay.engine.history()
    tl = replay.builder.build([_band(r, snap.now_wall) for r in history.restarts], history.checkpoints)
    view = View(snap, {**tail.rejected, DUPLICATE: snap.duplicates, LATE: snap.late,
                       IMPLAUSIBLE: snap.implausible}, {}, {})
    rejected = sum(view.rejected.values())
    warning = (f'<p class="fail">{rejected} journal lines were rejected and not accounted '
               f"(see Exporter below).</p>") if rejected else ""
    body = (f'<div class="grid"><section class="card wide"><h2>Timeline</h2>{warning}'
            f"{timeline.legend_html()}{timeline.render_svg(tl)}"
            f'<p class="sub">One lane per rank; hover a span for details. Restarts and their phases run '
            f"across all lanes; lost work is the training that a restart rolled back.</p></section></div>"
            f"{status_page.sections(view, targets)}")
    made = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    links = (f'<span class="ident">journal <b>{html.escape(str(journal_dir))}</b> · report made {made}</span>')
    return status_page.page("nvrx-slo report", snap, body, refresh_s=None, links=links)


def write(journal_dir: str | Path, output: str | Path, targets: Targets) -> Path:
    """Build the report of ``journal_dir`` and write it to ``output``; returns its absolute path."""
    document = build(journal_dir, targets)
    path = Path(output).resolve()
    path.write_text(document, encoding="utf-8")
    return path


def main(argv: list[str], targets: Targets) -> int:
    """``nvrx-slo report``; ``targets`` come from the SLO spec (``nvrx_slo/cli.py`` loads it)."""
    parser = argparse.ArgumentParser(prog="nvrx-slo report", description=__doc__.split("\n")[0])
    parser.add_argument("journal_dir", metavar="JOURNAL_DIR", type=Path, help="a journal directory (one pod's)")
    parser.add_argument("-o", "--output", type=Path, default=Path("report.html"), help="HTML file to write")
    args = parser.parse_args(argv)
    if not args.journal_dir.is_dir():
        parser.error(f"JOURNAL_DIR {args.journal_dir}: not a directory")
    try:
        print(write(args.journal_dir, args.output, targets))
    except (EmptyJournal, FileNotFoundError) as exc:
        print(f"nvrx-slo report: {exc}", file=sys.stderr)
        return 1
    return 0
