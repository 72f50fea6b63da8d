"""The timeline: lanes, lost-work shading, checkpoint markers, bounds and escaping (pure, no I/O)."""

import html
import itertools
import re
import xml.etree.ElementTree as ET

import pytest

from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.events import as_event
from nvrx_slo.exporter.offline.timeline_builder import TimelineBuilder
from nvrx_slo.exporter.views import timeline
from nvrx_slo.exporter.views.timeline import RestartBand

WALL0 = 1.7e9
_SEQ = itertools.count()  # unique per record, so the engine takes none for a duplicate
SVG_NS = "{http://www.w3.org/2000/svg}"


def rec(type_, mono, rank=0, pid=100, pod="pod-0", restart=0, iter_=0, **payload):
    """An event of a record the real schema accepts (validated, so tests cannot drift from the contract)."""
    return as_event({"v": 1, "type": type_, "seq": next(_SEQ), "mono": mono, "wall": WALL0 + mono, "job": "j",
                            "pod": pod, "node": "n", "rank": rank, "local_rank": rank, "pid": pid,
                            "restart": restart, "iter": iter_, **payload})


def step(n, end, rank=0, pid=100, dur=0.09, pod="pod-0", **waits):
    return rec("step", end, rank, pid, pod, step=n, start=end - dur, data_s=0.0, compute_s=dur, optimizer_s=0.0,
               **waits)


def checkpoint(ckpt, n, t, rank=0, pid=100, ok=True, error=None):
    return [rec("checkpoint_start", t, rank, pid, ckpt=ckpt, step=n, mode="async"),
            rec("checkpoint_scheduled", t + 0.02, rank, pid, ckpt=ckpt, plan_s=0.01, stage_s=0.01, bytes=10),
            rec("checkpoint_end", t + 0.6, rank, pid, ckpt=ckpt, step=n, ok=ok, written=t + 0.5, error=error)]


def restore(t, n, rank=0, pid=101):
    return rec("restore", t, rank, pid, start=t - 0.2, step=n, path=None, fallback=None)


def build(records, restarts=()):
    """The timeline as the report builds it: the records in time order through the engine (no
    reorder window, so it decides at once) and the builder, the engine's decisions handed over."""
    engine, b = Engine(0.0, keep_history=True), TimelineBuilder()
    for r in sorted(records, key=lambda r: r.mono):
        engine.ingest(r)
        b.add(r)
    b.decide(engine.take_decisions())
    return b.build(list(restarts), engine.history().checkpoints)


def test_waits_on_saves_are_drawn_where_and_as_long_as_the_engine_booked_them():
    """The loop's waits on saves reach the journal only as sums (``blocked_s`` on its next record);
    the engine books them from the stretch before the record, and from the step's own span for
    what that stretch cannot hold (a step timed by CUDA events ends late). The lane draws those
    stretches, handed out by the engine: their sum is the snapshot's checkpoint blocking."""
    records = [step(1, 10.0), step(2, 20.0, blocked_s=0.4),  # 9.91 s since step 1: all of it before
               step(3, 20.2, blocked_s=0.15),  # 0.11 s since step 2: 0.04 s from its own span
               step(4, 30.0), rec("user_span", 32.0, start=31.0, name="eval", blocked_s=0.25), step(5, 40.0)]
    engine = Engine(0.0, keep_history=True)
    for r in records:
        engine.ingest(r)
    b = TimelineBuilder()
    for r in records:
        b.add(r)
    decisions = engine.take_decisions()
    b.decide(decisions)
    b.decide(decisions)  # as the settling of a reorder window hands them out again: drawn once
    lane = b.build().lanes[0]
    drawn = [(sp.start, sp.end) for sp in lane.bars if sp.kind == timeline.BLOCKING]
    origin = b.build().origin_wall - WALL0
    assert [(round(s + origin, 6), round(e + origin, 6)) for s, e in drawn] == [
        (19.51, 19.91), (20.0, 20.15), (30.75, 31.0)]
    booked = engine.snapshot(40.0, WALL0 + 40.0).ranks[0].seconds[Category.CHECKPOINT_BLOCKING]
    assert sum(e - s for s, e in drawn) == pytest.approx(booked) and booked == pytest.approx(0.8)


def kinds_by_step(lane):
    """Map each step number mentioned in a single-step span's label to its kind."""
    out = {}
    for sp in lane.bars:
        m = re.match(r"(?:lost |unprotected )?step (\d+),", sp.label)
        if m:
            out[int(m.group(1))] = sp.kind
    return out


def test_steps_after_the_last_durable_checkpoint_are_shaded_lost_and_redone_steps_unprotected():
    # Steps 10 s apart (wider than the merge resolution) so each stays its own span.
    records = [step(n, 10.0 * n) for n in range(1, 7)]
    records += checkpoint("step-3", 3, 31.0)
    records += [restore(75.0, 3), step(4, 80.0, pid=101), step(5, 90.0, pid=101)]
    tl = build(records)
    got = kinds_by_step(tl.lanes[0])
    assert [got[n] for n in (1, 2, 3)] == ["step"] * 3
    lost = [sp for sp in tl.lanes[0].bars if sp.kind == "lost"]
    assert [sp.label.split(",")[0] for sp in lost] == ["lost step 4", "lost step 5", "lost step 6"]
    redone = [sp for sp in tl.lanes[0].bars if sp.start + tl.origin_wall > WALL0 + 75]
    assert [(sp.kind, sp.label.split(",")[0]) for sp in redone] == [("unprotected", "unprotected step 4"),
                                                                    ("unprotected", "unprotected step 5")]


def test_a_fallback_to_an_older_checkpoint_loses_only_the_undecided_redone_work():
    """docs/accounting.md: productive is final; a fallback restore decides only what is undecided."""
    records = [step(n, 10.0 * n) for n in range(1, 5)]
    records += [restore(50.0, 2), step(3, 60.0, pid=101), step(4, 70.0, pid=101)]
    records += [restore(80.0, 1, pid=102), step(2, 90.0, pid=102)]  # the step-2 checkpoint turned out corrupt
    tl = build(records)
    spans = sorted(tl.lanes[0].bars, key=lambda s: s.start)
    kinds = [(s.kind, s.label.split(",")[0]) for s in spans if s.kind in ("step", "lost")]
    assert kinds == [("step", "step 1"), ("step", "step 2"), ("lost", "lost step 3"), ("lost", "lost step 4"),
                     ("lost", "lost step 3"), ("lost", "lost step 4")]


def test_a_fresh_start_restore_loses_every_earlier_step():
    tl = build([step(1, 10.0), step(2, 20.0), restore(30.0, None), step(1, 40.0)])
    assert {sp.kind for sp in tl.lanes[0].bars if sp.kind in ("step", "lost")} == {"lost"}


def test_one_lane_per_rank_and_one_marker_per_checkpoint_with_its_status():
    records = []
    for rank in (0, 1, 2):
        records += [step(n, 1.0 * n, rank=rank, pid=100 + rank) for n in range(1, 4)]
        records += checkpoint("ok-ckpt", 2, 2.1, rank=rank, pid=100 + rank)
        records += checkpoint("bad-ckpt", 3, 3.1, rank=rank, pid=100 + rank, ok=rank != 1, error="disk full")
    records.append(rec("checkpoint_start", 3.5, 0, 100, ckpt="pending", step=3, mode="async"))
    tl = build(records)
    assert [lane.rank for lane in tl.lanes] == [0, 1, 2]
    assert {m.ckpt: m.status for m in tl.checkpoints} == {"ok-ckpt": "ok", "bad-ckpt": "failed",
                                                          "pending": "unfinished"}
    ok = next(m for m in tl.checkpoints if m.ckpt == "ok-ckpt")
    assert abs((ok.at + tl.origin_wall) - (WALL0 + 2.6)) < 1e-6  # the instant the write finished
    lane0 = tl.lanes[0]
    blocking = [sp for sp in lane0.bars if sp.kind == "blocking"]
    background = [sp for sp in lane0.bars if sp.kind == "background"]
    assert [round(sp.end - sp.start, 3) for sp in blocking] == [0.02, 0.02]
    assert [round(sp.end - sp.start, 3) for sp in background] == [0.48, 0.48]

    svg = ET.fromstring(timeline.render_svg(tl))
    lanes = svg.findall(f".//{SVG_NS}g[@class='tl-lane']")
    assert [g.get("data-rank") for g in lanes] == ["0", "1", "2"]
    assert sorted(p.get("data-ckpt") for p in svg.iter() if p.get("data-kind") == "checkpoint") == \
        ["bad-ckpt", "ok-ckpt", "pending"]


def test_a_checkpoint_saved_again_after_a_rollback_is_a_second_attempt():
    records = [rec("checkpoint_start", 1.0, ckpt="step-10", step=10, mode="async"),  # killed before it landed
               rec("checkpoint_start", 9.0, pid=101, restart=1, ckpt="step-10", step=10, mode="async"),
               rec("checkpoint_start", 12.0, pid=101, restart=1, ckpt="step-20", step=20, mode="async"),
               rec("checkpoint_end", 14.0, pid=101, restart=1, iter_=1, ckpt="step-20", step=20, ok=True,
                   written=13.5, error=None),  # observed after an in-process restart
               rec("checkpoint_end", 15.0, pid=101, restart=1, iter_=1, ckpt="step-10", step=10, ok=True,
                   written=15.0, error=None)]
    tl = build(records)
    assert [(m.ckpt, m.incarnation, m.status) for m in tl.checkpoints] == [
        ("step-10", (0, 0), "unfinished"), ("step-20", (1, 0), "ok"), ("step-10", (1, 0), "ok")]


def test_process_start_to_first_work_is_drawn_as_init():
    records = [rec("process_start", 1.0, world_size=1), restore(3.0, None, pid=100), step(1, 4.0),
               rec("process_start", 10.0, pid=101, world_size=1), step(2, 12.0, pid=101)]
    init = [(round(s.start, 3), round(s.end, 3)) for s in build(records).lanes[0].bars if s.kind == "init"]
    assert init == [(0.0, 1.8), (9.0, 10.91)]


def test_restarts_are_drawn_with_their_phases_and_set_the_time_range():
    records = [step(1, 1.0), step(2, 2.0)]
    band = RestartBand("injob", WALL0 + 2.5, WALL0 + 6.0,
                       (("detect", WALL0 + 2.5, WALL0 + 3.0), ("teardown", WALL0 + 3.0, WALL0 + 4.0),
                        ("rendezvous", WALL0 + 4.0, WALL0 + 5.0), ("reinit", WALL0 + 5.0, WALL0 + 6.0)),
                       cause="SIGKILL")
    tl = build(records, [band])
    assert abs(tl.duration - (6.0 - 0.91)) < 1e-6
    svg = ET.fromstring(timeline.render_svg(tl))
    groups = [g for g in svg.iter() if g.get("data-kind") == "restart"]
    assert len(groups) == 1 and groups[0].get("data-level") == "injob"
    phases = [r.get("class") for r in groups[0].iter(f"{SVG_NS}rect") if "tl-phase" in r.get("class", "")]
    assert phases == ["tl-phase tl-phase-detect", "tl-phase tl-phase-teardown",
                      "tl-phase tl-phase-rendezvous", "tl-phase tl-phase-reinit"]


@pytest.mark.slow
def test_a_huge_journal_stays_small_on_the_page():
    records = []
    ranks = timeline.MAX_LANES + 6
    for rank in range(ranks):
        records += [step(n, 0.01 * n, rank=rank, pid=1000 + rank, dur=0.009) for n in range(1, 1501)]
    for k in range(timeline.MAX_MARKERS + 50):
        records += checkpoint(f"c{k}", k, 0.05 * k, rank=0, pid=1000)
    tl = build(records)
    assert len(tl.lanes) == timeline.MAX_LANES and tl.lanes_omitted == 6
    assert len(tl.checkpoints) == timeline.MAX_MARKERS and tl.checkpoints_omitted == 50
    assert tl.checkpoints[-1].ckpt == f"c{timeline.MAX_MARKERS + 49}"  # the newest are kept
    per_kind_cap = timeline.PLOT_WIDTH // timeline.MERGE_PX + 1
    for lane in tl.lanes:
        for kind in ("step", "blocking", "background"):
            assert sum(sp.kind == kind for sp in lane.bars) <= per_kind_cap
    # every step is still accounted for in the merged runs
    assert sum(sp.count for sp in tl.lanes[1].bars if sp.kind == "unprotected") == 1500  # no save covers them
    svg = timeline.render_svg(tl)
    assert len(svg) < 1_500_000, len(svg)
    assert "6 more ranks not drawn" in svg and "50 older checkpoints not marked" in svg


def test_journal_strings_are_escaped_everywhere():
    evil = '"><script>alert(1)</script><img src=x onerror=alert(2)>'
    records = checkpoint(evil, 1, 1.0, ok=False, error=evil) + [step(1, 0.5, pod=evil)]
    band = RestartBand(evil, WALL0 + 2.0, WALL0 + 3.0, ((evil, WALL0 + 2.0, WALL0 + 3.0),), cause=evil)
    svg_text = timeline.render_svg(build(records, [band]))
    assert "<script" not in svg_text and "<img" not in svg_text
    svg = ET.fromstring(svg_text)  # still well-formed XML
    assert any(el.get("data-ckpt") == evil for el in svg.iter())  # the id survives, as data
    titles = [t.text for t in svg.iter(f"{SVG_NS}title")]
    assert any(evil in (t or "") for t in titles)
    assert html.escape(evil) in svg_text


@pytest.mark.parametrize("story", ["healthy", "crash_with_rollback", "inprocess_restart", "pod_restart",
                                   "survivor_of_another_pods_fault"])
def test_records_added_together_are_placed_as_one_by_one(story):
    """``add_many`` (the replay's: a process's steps together) builds exactly what ``add`` builds."""
    import stories

    pod = getattr(stories, story)()
    records = sorted((as_event(r) for r in pod.records), key=lambda e: (e.mono, e.pid, e.seq))
    records += [step(n, 1e4 + n, rank=5, pid=900 + n % 2) for n in range(6)]  # two processes, interleaved
    one, many = TimelineBuilder(), TimelineBuilder()
    for r in records:
        one.add(r)
    for lo, hi in itertools.pairwise([0, 5, 6, len(records) // 2, len(records)]):
        many.add_many(records[lo:hi])
    assert vars(many) == vars(one)
    assert len(one._ranks) > 1 and sum(len(d.step_no) for d in one._ranks.values()) > 6


def test_a_lane_in_time_order_is_drawn_as_step_by_step(tmp_path):
    """A lane whose steps all are drawn and end in time order (the usual lane) is merged in C-level
    passes: exactly the runs the step-by-step merge makes of it."""
    from bench import synthetic_journal
    from nvrx_slo.exporter.offline import timeline_builder as tb
    from nvrx_slo.exporter.offline.replay import Replay

    synthetic_journal.write(tmp_path, 2, 425, restart_at=230)  # lost steps, steps after the last save
    builder = TimelineBuilder()
    with Replay(tmp_path, builder=builder) as replay:
        replay.read_all()
    replay.view()
    for data in builder._ranks.values():
        kinds = tb._kinds(data)
        assert {tb.STEP, tb.LOST, tb.UNPROTECTED} <= set(kinds)
        lo = min(data.step_start)
        for resolution in (0.0, 0.6, 30.0):
            raw = ((k, data.step_start[i] - lo, data.step_end[i] - lo, data.step_no[i]) for i, k in enumerate(kinds))
            merged = tb._merged_in_order(data, kinds, lo, resolution)
            assert merged == tb._merge_steps(raw, resolution) and len(merged) > 1
