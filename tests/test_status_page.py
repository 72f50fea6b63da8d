"""The status page: a hostile journal renders escaped and inert; SLO verdicts on both sides of each
threshold. The page in a real browser against a real sidecar is in ``test_status_page_browser.py``."""

from __future__ import annotations

import dataclasses
import html

import pytest

from journal_fixtures import write_journal
from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.contracts import schema
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.engine.snapshot import RestartStats
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.live import Live
from nvrx_slo.exporter.views import judgement, status_page
from nvrx_slo.exporter.views.view import View
from pages import assert_inert
from snapshot_fixtures import TARGETS, histogram, snapshot
from stories import EVIL, inprocess_job


def test_a_hostile_journal_gives_an_escaped_inert_page_with_the_right_numbers(tmp_path):
    write_journal(inprocess_job(), tmp_path)
    with open(tmp_path / schema.journal_file_name("pod-0", 1, 102), "ab") as f:
        f.write(b'{"v":1,"type":"checkpoint_end","ckpt":"</td></tr></table><script>alert(4)</script>"\n')
        f.write(b"\x00" * 100 + b"\n")
    live = Live(Engine(), JournalTail(tmp_path), mono=lambda: 2000.0, wall=lambda: 1.7e9 + 2000.0)
    live.poll()
    view = live.view()
    document = status_page.render(view, TARGETS)

    inv = assert_inert(document)
    assert EVIL in "".join(inv.text) and html.escape(EVIL) in document
    assert '<meta http-equiv="refresh" content="5">' in document
    assert {v for k, v in inv.attrs if k == "href"} == {"metrics", "healthz"}  # relative: works behind a port-forward
    snap = view.snapshot
    assert float(inv.by_id["efficiency"]["data-value"]) == snap.efficiency
    assert float(inv.by_id["wall-seconds"]["data-value"]) == snap.wall_s
    assert inv.by_id["rejected"]["data-value"] == "2" == str(sum(view.rejected.values()))
    assert inv.by_id["checkpoint-saves"]["data-value"] == "3"
    shares = [float(v["data-value"]) for k, v in inv.by_id.items() if k.startswith("share-")]
    assert sum(shares) == pytest.approx(1.0)
    assert len(document) < 100_000


def _view(**kw: object) -> View:
    return View(snapshot(**kw), {}, {}, {})


def _restarts(durations: list[float]) -> RestartStats:
    snap = snapshot()
    rs = snap.restarts
    duration = {lv: histogram(cat.RESTART_BUCKETS, durations if lv is cat.RestartLevel.INJOB else [])
                for lv in cat.RestartLevel}
    return dataclasses.replace(rs, duration=duration)


def _verdicts(snap, targets=TARGETS) -> dict[str, bool | None]:
    return {r.key: r.ok for r in judgement.slo_results(snap, targets)}


@pytest.mark.parametrize("productive, ok", [(99.0, True), (98.9, False)])
def test_the_efficiency_slo_is_judged_at_its_target(productive, ok):
    snap = snapshot(ranks=tuple(dataclasses.replace(r, seconds={**r.seconds, cat.Category.PRODUCTIVE: productive})
                                for r in snapshot().ranks))
    assert _verdicts(snap)["efficiency"] is ok


@pytest.mark.parametrize("durations, ok", [([3.0] * 99 + [10.0], True), ([3.0] * 98 + [10.5, 12.0], False),
                                           ([], None)])
def test_the_recovery_slo_counts_restarts_back_within_ten_seconds(durations, ok):
    assert _verdicts(snapshot(restarts=_restarts(durations)))["recovery"] is ok


@pytest.mark.parametrize("blocking, overlap, verdict", [(0.01, 0.95, (True, True)), (0.0101, 0.949, (False, False)),
                                                        (None, None, (None, None))])
def test_the_checkpoint_slos(blocking, overlap, verdict):
    ck = dataclasses.replace(snapshot().checkpoints, blocking_fraction=blocking, overlap_ratio=overlap)
    v = _verdicts(snapshot(checkpoints=ck))
    assert (v["checkpoint_blocking"], v["checkpoint_overlap"]) == verdict


def test_the_verdicts_follow_the_spec_not_a_number_in_the_view():
    snap = snapshot(ranks=tuple(dataclasses.replace(r, seconds={**r.seconds, cat.Category.PRODUCTIVE: 95.0})
                                for r in snapshot().ranks))
    assert _verdicts(snap)["efficiency"] is False
    looser = dataclasses.replace(TARGETS, efficiency=0.9, checkpoint_blocking=0.9)
    assert _verdicts(snap, looser)["efficiency"] is True
    document = status_page.render(View(snap, {}, {}, {}), looser)
    assert "productive / wall ≥ 90%" in document and "blocking ≤ 10% of wall" in document


def test_the_page_shows_each_verdict_with_its_value():
    ck = dataclasses.replace(snapshot().checkpoints, blocking_fraction=0.02)
    document = status_page.render(_view(checkpoints=ck), TARGETS)
    inv = assert_inert(document)
    assert inv.by_id["slo-checkpoint_blocking"]["data-ok"] == "false"
    assert inv.by_id["slo-checkpoint_blocking-value"]["data-value"] == "0.02"
    assert inv.by_id["slo-checkpoint_overlap"]["data-ok"] == "false"  # the fixture's overlap is 0.9
    assert inv.by_id["slo-recovery"]["data-ok"] == "true"  # one in-job restart of 3 s


def test_every_category_has_a_label_and_a_colour_of_its_own():
    from nvrx_slo.contracts.catalogue import Category

    assert set(status_page.CATEGORY_STYLES) == set(Category)
    colours = [style.colour for style in status_page.CATEGORY_STYLES.values()]
    assert len(set(colours)) == len(colours)
    css = status_page.category_css()
    assert all(f".c-{c.value} {{" in css and f"--{c.value}: " in css for c in Category)
