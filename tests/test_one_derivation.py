"""One derivation per fact: on every stored journal story, what the report's timeline draws for each
step agrees with the engine's accounting beside it on the same page.

The timeline takes each step's fate from the engine's verdicts; the engine's seconds come from its
ledgers' sums. This checks the two paths against each other, step by step and in seconds: a step
drawn productive carries exactly its work into ``productive``, one drawn lost into ``lost``, and
the rest is unprotected. It also checks that the report's SVG draws exactly those steps.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import stories
from journal_builder import Pod
from journal_fixtures import write_journal
from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.exporter.events import as_event
from nvrx_slo.exporter.offline import report, timeline_builder
from nvrx_slo.exporter.offline.replay import Replay
from nvrx_slo.exporter.offline.timeline_builder import TimelineBuilder
from nvrx_slo.exporter.views.timeline import LOST, STEP, UNPROTECTED
from snapshot_fixtures import TARGETS

STORIES = {
    "healthy": stories.healthy,
    "crash with rollback": stories.crash_with_rollback,
    "in-process restart": stories.inprocess_restart,
    "failed save": stories.failed_save,
    "pod restart": stories.pod_restart,
    "an exception left a step": lambda: stories.killed_from_outside(raised=True),
    "report story": stories.inprocess_job,
}


def step_kinds(builder: TimelineBuilder, rank: int) -> list[tuple[float, int, str]]:
    """``(end mono, step, kind)`` of each step of ``rank``, oldest first: what its lane draws, before
    the drawing merges steps into runs (read from the builder's own arrays)."""
    data = builder._ranks[rank]
    kinds = timeline_builder._kinds(data)
    return sorted((m, n, k) for m, n, k in zip(data.step_mono, data.step_no, kinds, strict=True) if k is not None)


@pytest.mark.parametrize("name", sorted(STORIES))
def test_the_timeline_the_report_and_the_engine_agree_on_every_step(name: str, tmp_path: Path) -> None:
    pod: Pod = STORIES[name]()
    write_journal(pod, tmp_path, evil=False)
    builder = TimelineBuilder()
    with Replay(tmp_path, builder=builder) as replay:  # the report's own replay, through both
        replay.read_all()
    steps = [as_event(r) for r in pod.records if r["type"] in ("step", "step_failed")]  # a failed one: lost work
    newest = max(pod.records, key=lambda r: r["mono"])
    snap = replay.view((newest["mono"], newest["wall"])).snapshot

    drawn: dict[str, int] = {STEP: 0, LOST: 0, UNPROTECTED: 0}
    for rank in snap.ranks:
        work = {(s.mono, s.step): s.mono - s.start - getattr(s, "data_s", 0.0) for s in steps if s.rank == rank.rank}
        kinds = step_kinds(builder, rank.rank)
        assert len(kinds) == len(work)
        seconds = {STEP: 0.0, LOST: 0.0, UNPROTECTED: 0.0}
        for mono, step_no, kind in kinds:
            seconds[kind] += work[(mono, step_no)]
            drawn[kind] += 1
        assert seconds[STEP] == pytest.approx(rank.seconds[Category.PRODUCTIVE], abs=1e-6), (rank.rank, kinds)
        assert seconds[LOST] == pytest.approx(rank.seconds[Category.LOST], abs=1e-6), (rank.rank, kinds)
        assert seconds[UNPROTECTED] <= rank.unprotected_s + 1e-6

    document = report.build([tmp_path], TARGETS)
    for kind, count in drawn.items():
        in_svg = sum(int(n) for n in re.findall(rf'<rect class="tl-{kind}"[^>]*data-count="(\d+)"', document))
        assert in_svg == count, (kind, in_svg, count)
    assert document.count('data-kind="restart"') == sum(snap.restarts.counts.values())
