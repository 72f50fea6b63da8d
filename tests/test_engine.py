"""The accounting engine on hand-built journals: each case is a sentence about what it must say."""

from __future__ import annotations

import json
import random

import pytest

import stories
from journal_builder import Pod, Proc
from nvrx_slo.contracts.catalogue import Category, FaultCause, RestartLevel, RestartPhase
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.engine.snapshot import RankState, Snapshot
from nvrx_slo.exporter.events import as_event

P, L, B, R = Category.PRODUCTIVE, Category.LOST, Category.CHECKPOINT_BLOCKING, Category.CHECKPOINT_RESTORE
RS, IN, D, U = Category.RESTART, Category.INIT, Category.DATA_WAIT, Category.UNATTRIBUTED
SD = Category.SHUTDOWN


def run(pod: Pod, now: float, window: float = 0.5, records: list | None = None) -> Snapshot:
    engine = Engine(reorder_window_s=window)
    for record in pod.records if records is None else records:
        engine.ingest(as_event(record))
    return engine.snapshot(now, now + pod.wall_offset)


def check_invariant(snap: Snapshot) -> None:
    for r in snap.ranks:
        assert sum(r.seconds.values()) + r.unprotected_s == pytest.approx(r.wall_s, abs=1e-9), r.rank
        assert all(v >= -1e-12 for v in r.seconds.values()) and r.unprotected_s >= -1e-12


# sentence, scenario, now, {rank: {category: seconds}}, {rank: unprotected}
ACCOUNTING = [
    ("a healthy run's steps are productive up to the durable save and unprotected after it; from the last "
     "step to the exits is shutdown; wall stops at the launcher's exit",
     stories.healthy, 100.0,
     {0: {P: 4.5, D: 1.0, B: 0.2, IN: 3.0, SD: 1.0, U: 0, L: 0, R: 0, RS: 0}}, {0: 4.5, 1: 4.5}),
    ("a crash loses the steps after the restored checkpoint; each rank's restart runs from its own fault "
     "to its first step, minus the restore",
     stories.crash_with_rollback, 100.0,
     {0: {P: 7.1, L: 3.0, B: 0.2, R: 0.5, RS: 2.4, IN: 2.0, SD: 1.4, U: 0.2},
      1: {P: 7.0, L: 3.0, B: 0.2, R: 0.5, RS: 2.7, IN: 2.0, SD: 1.4, U: 0.0}}, {0: 0.0, 1: 0.0}),
    ("an in-process restart loses the steps after the restored checkpoint; a rank without an injected "
     "fault is restarting from its last step",
     stories.inprocess_restart, 100.0,
     {0: {P: 2.0, L: 2.0, B: 0.1, R: 0.4, RS: 2.4, IN: 1.0, SD: 0.5, U: 2.1},
      1: {P: 2.0, L: 2.0, B: 0.1, R: 0.4, RS: 4.5, IN: 1.0, SD: 0.5, U: 0.0}}, {0: 3.0, 1: 3.0}),
    ("a failed save protects nothing: its steps stay unprotected, the open tail too",
     stories.failed_save, 10.0,
     {0: {P: 0.0, B: 0.1, IN: 1.0}}, {0: 8.9}),
    ("a pod restart (new launcher, restart count from 0) accounts the dead time as restart",
     stories.pod_restart, 30.0,
     {0: {P: 2.0, L: 1.0, B: 0.1, R: 0.5, RS: 17.9, IN: 2.0}}, {0: 6.5}),
]


@pytest.mark.parametrize("sentence, build, now, seconds, unprotected", ACCOUNTING, ids=[c[0][:60] for c in ACCOUNTING])
def test_accounting(sentence, build, now, seconds, unprotected):
    snap = run(build(), now)
    check_invariant(snap)
    ranks = {r.rank: r for r in snap.ranks}
    for rank, expected in seconds.items():
        for category, value in expected.items():
            assert ranks[rank].seconds[category] == pytest.approx(value, abs=1e-9), (rank, category)
    for rank, value in unprotected.items():
        assert ranks[rank].unprotected_s == pytest.approx(value, abs=1e-9), rank


# sentence, scenario, level, cause, duration, phases
RESTARTS = [
    ("an ft_launcher restart is counted once for the pod, from the injected fault to the last rank's first "
     "step, phases from the launcher's events", stories.crash_with_rollback, RestartLevel.INJOB,
     "injected crash", 3.0,
     {RestartPhase.DETECT: 0.4, RestartPhase.TEARDOWN: 0.3, RestartPhase.RENDEZVOUS: 0.5,
      RestartPhase.REINIT: 0.7, RestartPhase.RESTORE: 1.1}),
    ("an in-process restart is counted once, phases from the Wrapper callbacks (earliest abort, "
     "latest finalize, rank assignment and initialize)", stories.inprocess_restart, RestartLevel.INPROCESS,
     "injected exception", 2.8,
     {RestartPhase.DETECT: 1.0, RestartPhase.TEARDOWN: 0.4, RestartPhase.RENDEZVOUS: 0.5,
      RestartPhase.REINIT: 0.25, RestartPhase.RESTORE: 0.65}),
    ("a pod restart without a journaled fault runs from the last event of the dead pod; phases it cannot "
     "see are folded into the next", stories.pod_restart, RestartLevel.POD, None, 18.4,
     {RestartPhase.DETECT: 14.9, RestartPhase.RENDEZVOUS: 1.0, RestartPhase.REINIT: 1.0,
      RestartPhase.RESTORE: 1.5}),
]


@pytest.mark.parametrize("sentence, build, level, cause, duration, phases", RESTARTS, ids=[c[0][:60] for c in RESTARTS])
def test_restarts(sentence, build, level, cause, duration, phases):
    snap = run(build(), 100.0)
    stats = snap.restarts
    assert {lv: n for lv, n in stats.counts.items() if n} == {level: 1}
    (record,) = stats.recent
    assert (record.level, record.cause, record.ranks) == (level, cause, 2)
    assert record.duration_s == pytest.approx(duration)
    assert record.phases.keys() == phases.keys()
    for phase, seconds in phases.items():
        assert record.phases[phase] == pytest.approx(seconds), phase
    assert sum(record.phases.values()) == pytest.approx(duration)
    assert stats.duration[level].count == 1 and stats.duration[level].sum == pytest.approx(duration)
    assert stats.mtbf_s == pytest.approx(snap.ranks[0].wall_s)


def test_the_restart_counter_moves_before_the_duration_is_known():
    pod = stories.crash_with_rollback()
    cut = [r for r in pod.records if r["mono"] <= 11.0]  # restarted processes restored, no step yet
    snap = run(pod, 11.0, window=0.0, records=cut)
    assert snap.restarts.counts[RestartLevel.INJOB] == 1
    assert snap.restarts.duration[RestartLevel.INJOB].count == 0
    (record,) = snap.restarts.recent
    assert record.duration_s is None


def test_a_healthy_runs_checkpoint_numbers():
    snap = run(stories.healthy(), 100.0)
    ck = snap.checkpoints
    assert (ck.saves, ck.failures, ck.in_flight, ck.bytes_total, ck.last_success_step) == (1, 0, 0, 2000, 5)
    assert ck.blocking.count == 2 and ck.blocking.sum == pytest.approx(0.4)  # one per rank per save
    assert ck.background.sum == pytest.approx(1.6)
    assert ck.overlap_ratio == pytest.approx(0.8)
    assert ck.blocking_fraction == pytest.approx(0.4 / (2 * 14.2))
    assert ck.last_success_wall == pytest.approx(9.0 + pod_offset())
    assert ck.age_s == pytest.approx(100.0 - 9.0)
    (record,) = ck.recent
    assert (record.ckpt, record.step, record.mode, record.ok, record.ranks) == ("step-000005", 5, "async", True, 2)
    assert record.blocking_s == pytest.approx(0.2) and record.background_s == pytest.approx(0.8)


def pod_offset() -> float:
    return Pod().wall_offset


def test_a_failed_save_is_counted_once_for_the_pod_and_is_no_success():
    ck = run(stories.failed_save(), 10.0).checkpoints
    assert (ck.failures, ck.saves, ck.last_success_step, ck.in_flight) == (1, 0, None, 0)


def test_a_save_not_yet_durable_is_in_flight_until_its_process_dies():
    pod = Pod()
    p = pod.proc(0)
    p.start(0.0)
    p.step(1, 1.0, 2.0)
    p.save(1, 2.0, 2.1, written=3.0, observed=3.5)
    assert run(pod, 3.0).checkpoints.in_flight == 1
    pod.proc(0, restart=1).start(5.0)  # the process died mid save
    assert run(pod, 6.0).checkpoints.in_flight == 0


@pytest.mark.parametrize("start_last", [False, True])
def test_one_process_saving_an_id_again_after_inprocess_restarts_makes_two_saves_in_any_arrival_order(start_last):
    """The second save's start may be read after its other records (any order): it still is the
    second save, not a part of the first (which once read 2.3 s of blocking and one save in flight)."""
    pod = Pod()
    p = pod.proc(0)
    p.start(0.5, world_size=1, local_world_size=1)
    p.save(0, 1.1, 1.2, written=1.4, observed=1.45)
    p.save_end()
    p.iter = 2  # two in-process restarts later (a rollback), the same id again
    p.save(0, 3.3, 3.4, written=3.6, observed=3.65)
    p.save_end()
    records = list(pod.records)
    if start_last:
        (second,) = [r for r in records if r["type"] == "checkpoint_start" and r["iter"] == 2]
        records = [r for r in records if r is not second] + [second]
    ck = run(pod, 20.0, window=10.0, records=records).checkpoints
    assert [(c.incarnation, round(c.blocking_s, 6), c.ok) for c in ck.recent] == [((0, 0), 0.1, True),
                                                                                  ((0, 2), 0.1, True)]
    assert (ck.failures, ck.in_flight) == (0, 0)


def _one_pod_of_four(rank: int) -> tuple[Pod, Proc, Proc]:
    """One pod (``rank``) of a four-pod job under our launcher: its first step, to 2.0 s."""
    pod = Pod()
    launcher = pod.launcher(0.0)
    launcher.ev("launcher_worker_start", 0.1)
    p = pod.proc(rank)
    p.start(1.0, world_size=4, local_world_size=1)
    p.step(1, 1.5, 2.0)
    return pod, launcher, p


def _shifted_from_rank_2_to_1() -> tuple[Pod, Proc, Proc]:
    """One pod (rank 2) of a four-pod job whose process the Wrapper shifted to rank 1 at 2.5 s."""
    pod, launcher, p = _one_pod_of_four(2)
    p.rank, p.iter = 1, 1
    p.ev("inprocess_initialize", 2.5)
    return pod, launcher, p


def _next_round_runs_rank_2(pod, launcher, p) -> None:
    """The launcher tears ``p`` down and starts its next round, which runs rank 2 to its end."""
    launcher.ev("launcher_worker_exit", 3.0, worker_pid=p.pid)
    launcher.ev("launcher_worker_start", 4.0)
    q = pod.proc(2, restart=1)
    q.start(5.0, world_size=4, local_world_size=1)
    q.step(1, 6.0, 6.5)
    q.end(7.0)


def test_a_pod_finishes_when_a_torn_down_process_had_journaled_as_another_rank():
    """A four-pod job: the Wrapper's in-process restart shifted this pod's process from rank 2 to
    rank 1 just before the launcher tore it down; the next round ran rank 2 to its end. The torn-down
    process never journaled its end: the pod still finished (it once read running)."""
    pod, launcher, p = _shifted_from_rank_2_to_1()
    _next_round_runs_rank_2(pod, launcher, p)
    launcher.ev("launcher_exit", 7.5, code=0)
    assert run(pod, 10.0).finished


def test_a_pod_finishes_from_its_launchers_last_round_of_workers_only():
    """A four-pod job: this pod's first round ran rank 3, torn down without an end when the job
    restarted; its next round ran rank 2 to its end. The pod finished: the rank of a round before
    the launcher's last start is not one it still waits for."""
    pod, launcher, p = _one_pod_of_four(3)
    _next_round_runs_rank_2(pod, launcher, p)
    assert not run(pod, 7.2).finished  # the launcher runs
    launcher.ev("launcher_exit", 7.5, code=0)
    assert run(pod, 10.0).finished


def test_a_process_the_wrapper_shifted_to_another_rank_is_still_one_accelerator_of_its_pod():
    """A four-pod job: NVRx's Wrapper terminated rank 1 (another pod's) and shifted this pod's
    process from rank 2 to rank 1; it trained on as rank 1. It is one accelerator of this pod: one
    lane (the rank it started as), its wall counted once, every step in it, through a state reload."""
    pod, launcher, p = _shifted_from_rank_2_to_1()
    p.step(2, 3.0, 3.5)
    p.step(3, 3.5, 4.0)
    p.end(4.2)
    launcher.ev("launcher_exit", 4.5, code=0)
    half = len(pod.records) // 2
    engine = Engine(reorder_window_s=0.0)
    for record in pod.records[:half]:
        engine.ingest(as_event(record))
    engine = Engine.from_state(engine.to_state())
    for record in pod.records[half:]:
        engine.ingest(as_event(record))
    snap = engine.snapshot(10.0, 10.0)
    assert snap.finished
    (lane,) = snap.ranks
    assert (lane.rank, lane.steps, lane.step) == (2, 3, 3)
    assert lane.wall_s == pytest.approx(4.5)
    check_invariant(snap)


def test_a_finished_job_stops_accruing_wall_and_settles_everything():
    pod = stories.healthy()
    early, late = run(pod, 20.0, window=10.0), run(pod, 1000.0, window=10.0)
    assert early.finished and late.finished
    assert early.ranks[0].wall_s == late.ranks[0].wall_s == pytest.approx(14.2)
    assert early.ranks == late.ranks
    assert early.ranks[0].seconds[P] == pytest.approx(4.5)  # nothing left provisional but the pool


def test_a_job_whose_launcher_has_not_exited_keeps_accruing():
    pod = stories.healthy()
    records = [r for r in pod.records if r["type"] != "launcher_exit"]
    snap = run(pod, 50.0, records=records)
    assert not snap.finished and snap.ranks[0].wall_s == pytest.approx(50.0)
    check_invariant(snap)


def test_a_finish_read_after_a_later_snapshot_ends_wall_there_not_before():
    """The reader lagged: a snapshot showed the job running at 50 s; its end (14.2 s) is read
    after. Wall stays at 50 (the open tail settled as unattributed), also across a saved state."""
    pod = stories.healthy()
    ends = [r for r in pod.records if r["type"] in ("process_end", "launcher_exit")]
    engine = Engine(reorder_window_s=0.5)
    for record in pod.records:
        if record not in ends:
            engine.ingest(as_event(record))
    running = engine.snapshot(50.0, 50.0)
    engine = Engine.from_state(json.loads(json.dumps(engine.to_state())))
    for record in ends:
        engine.ingest(as_event(record))
    finished = engine.snapshot(60.0, 60.0)
    assert finished.finished and not running.finished
    assert running.ranks[0].wall_s == finished.ranks[0].wall_s == pytest.approx(50.0)
    for category, seconds in running.ranks[0].seconds.items():
        assert finished.ranks[0].seconds[category] >= seconds, category
    check_invariant(finished)
    assert run(pod, 50.0).ranks[0].wall_s == pytest.approx(14.2)  # read in time: the job's own end


def test_launcher_restarts_remaining_is_max_restarts_minus_the_current_launchers_restart_count():
    pod = stories.crash_with_rollback()  # --max-restarts 3, workers restarted once
    before = [r for r in pod.records if r["restart"] == 0]
    assert run(pod, 5.0, records=before).restarts.launcher_remaining == 3
    assert run(pod, 100.0).restarts.launcher_remaining == 2
    pod.launcher(200.0)  # the container restarted: a new launcher counts from 0, its workers not up yet
    assert run(pod, 200.0).restarts.launcher_remaining == 3
    assert run(Pod(), 1.0).restarts.launcher_remaining is None  # no launcher journaled
    unknown = Pod()
    unknown.proc(None).ev("launcher_start", 0.0, max_restarts=None)  # launched without a known budget
    assert run(unknown, 1.0).restarts.launcher_remaining is None


def test_a_pod_runs_the_ranks_its_launcher_said_from_the_launchers_start_and_the_job_its_fixed_world():
    """So the job counts no rank absent while a pod's launcher is starting its workers: that time
    is the ranks' init, from the launcher's start (the job report counts it so too)."""
    pod = Pod()
    launcher = pod.proc(None)
    launcher.ev("launcher_start", 0.0, max_restarts=3, local_world_size=2, world_size=8)
    early = run(pod, 3.0)
    assert (early.pod_ranks, early.world_size, early.ranks) == (2, 8, ())
    pod.proc(0).start(4.0, world_size=8, local_world_size=2)
    assert run(pod, 5.0).pod_ranks == 2  # one journaled, the other still starting
    launcher.ev("launcher_exit", 6.0, code=0)
    assert run(pod, 7.0).pod_ranks == 1  # no launcher left to start the other
    unsaid = Pod()
    unsaid.proc(None).ev("launcher_start", 0.0, max_restarts=3)  # an older launcher, or --nproc-per-node gpu
    assert (run(unsaid, 1.0).pod_ranks, run(unsaid, 1.0).world_size) == (0, None)


def test_a_ranks_buffer_keeps_only_the_records_its_reorder_window_still_holds():
    pod = Pod()
    p = pod.proc(0)
    p.start(0.0)
    for step in range(1, 1001):
        p.step(step, step * 0.5 - 0.5, step * 0.5)
    engine = Engine(reorder_window_s=10.0)
    for record in pod.records:
        engine.ingest(as_event(record))
    pending = engine.to_state()["lanes"]["0"]["pending"]
    assert len(pending) == 21  # steps ending in (490, 500]; every older one applied and let go
    assert run(pod, 500.0, window=10.0).ranks[0].steps == 1000


def test_duplicates_are_counted_and_change_nothing():
    pod = stories.crash_with_rollback()
    once = run(pod, 100.0)
    twice = run(pod, 100.0, records=pod.records + pod.records[::3])
    assert twice.duplicates == len(pod.records[::3]) and once.duplicates == 0
    assert twice.events_accepted == once.events_accepted == len(pod.records)
    assert twice.ranks == once.ranks and twice.restarts == once.restarts and twice.checkpoints == once.checkpoints


def test_out_of_order_arrival_within_the_window_changes_nothing():
    pod = stories.crash_with_rollback()
    shuffled = pod.records[:]
    random.Random(7).shuffle(shuffled)  # the whole journal spans < 20 s: inside a 30 s window
    in_order, out_of_order = run(pod, 100.0, window=30.0), run(pod, 100.0, window=30.0, records=shuffled)
    assert out_of_order.out_of_order > 0 and out_of_order.late == 0
    assert out_of_order.ranks == in_order.ranks
    assert out_of_order.restarts == in_order.restarts
    assert out_of_order.checkpoints == in_order.checkpoints


def test_a_record_older_than_the_window_is_late_counted_and_not_accounted():
    pod = Pod()
    p = pod.proc(0)
    p.start(0.0)
    p.step(1, 1.0, 2.0)
    p.step(2, 2.0, 3.0)
    p.step(3, 10.0, 11.0)
    start, step1, step2, step3 = pod.records
    snap = run(pod, 11.0, window=1.0, records=[start, step2, step3, step1])  # step 2 applied when 3 came
    assert snap.late == 1
    assert snap.ranks[0].steps == 3  # a step is a step, even if its time could not be placed
    assert snap.ranks[0].seconds[IN] == pytest.approx(2.0)  # 0 -> 2: no first step seen before step 2
    check_invariant(snap)


def test_a_wall_clock_jump_changes_no_duration():
    pod = stories.crash_with_rollback()
    for record in pod.records:
        if record["mono"] > 9.0:
            record["wall"] -= 3600.0  # NTP stepped the clock back an hour mid restart
    plain = run(stories.crash_with_rollback(), 100.0)
    jumped = run(pod, 100.0)
    assert [r.seconds for r in jumped.ranks] == [r.seconds for r in plain.ranks]
    assert jumped.restarts.recent[0].duration_s == pytest.approx(plain.restarts.recent[0].duration_s)


def test_the_async_worker_dying_is_reported_for_its_rank():
    pod = stories.healthy()
    records = [r for r in pod.records if r["type"] not in ("process_end", "launcher_exit")]
    dead = pod.proc(1)  # stand-in for rank 1's process: reuse its pid
    dead.pid = records[-1]["pid"]
    dead.seq = 10_000
    dead.ev("checkpoint_worker", 14.0, alive=False, worker_pid=None)
    snap = run(pod, 15.0, records=records + [pod.records[-1]])
    assert [r.worker_alive for r in snap.ranks] == [True, False]


def test_a_straggler_has_a_skew_ratio_above_one():
    pod = Pod()
    ranks = [pod.proc(r) for r in range(3)]
    for i, p in enumerate(ranks):
        p.start(0.0, world_size=3)
        t = 1.0
        for step in range(1, 6):
            length = 2.0 if i == 2 else 1.0
            p.step(step, t, t + length)
            t += length
    snap = run(pod, 12.0)
    assert [r.skew_ratio for r in snap.ranks] == pytest.approx([1.0, 1.0, 2.0])


def test_gpu_idle_from_step_phases_is_wall_minus_step_work():
    snap = run(stories.healthy(), 100.0)
    r = snap.ranks[0]
    work = r.seconds[P] + r.seconds[L] + r.unprotected_s
    assert r.gpu_idle_s == pytest.approx(r.wall_s - work)
    assert r.gpu_idle_s == pytest.approx(14.2 - 9.0)


def test_rank_view_reports_the_newest_process():
    snap = run(stories.crash_with_rollback(), 100.0)
    r = snap.ranks[0]
    assert (r.restart, r.iter, r.state, r.steps, r.step) == (1, 0, RankState.ENDED, 10, 7)
    assert r.step_duration.count == 10 and r.step_duration.counts[-1] == 10
    assert r.last_step_wall == pytest.approx(15.3 + pod_offset())


def test_snapshot_changes_nothing_but_the_instant_shown_and_identity_comes_from_the_journal():
    pod = stories.crash_with_rollback()
    engine = Engine(reorder_window_s=5.0)
    for record in pod.records[:-1]:  # all but the launcher's exit: the job runs
        engine.ingest(as_event(record))
    before = {**engine.to_state(), "shown": 16.3}  # its newest record
    assert not engine.snapshot(16.0, 1.0).finished
    assert json.dumps(engine.to_state(), sort_keys=True) == json.dumps(before, sort_keys=True)
    engine.ingest(as_event(pod.records[-1]))
    assert engine.snapshot(100.0, 1.0).finished  # the first snapshot after its end settles it, once
    before = {**engine.to_state(), "shown": 16.8}  # the job's end: where a snapshot counts wall to
    a, b = engine.snapshot(100.0, 1.0), engine.snapshot(100.0, 1.0)
    assert a == b and json.dumps(engine.to_state(), sort_keys=True) == json.dumps(before, sort_keys=True)
    assert (a.job, a.pod, a.node, a.job_start_wall) == ("job", "pod-0", "node-0", pod_offset())
    assert a.efficiency == pytest.approx(a.seconds[P] / a.wall_s)


def test_state_round_trips_through_json_mid_stream():
    pod = stories.crash_with_rollback()
    whole = Engine(reorder_window_s=2.0)
    for record in pod.records:
        whole.ingest(as_event(record))
    half = Engine(reorder_window_s=2.0)
    cut = len(pod.records) // 2
    for record in pod.records[:cut]:
        half.ingest(as_event(record))
    resumed = Engine.from_state(json.loads(json.dumps(half.to_state(), allow_nan=False)))
    for record in pod.records[cut - 5:]:  # the reader re-reads a few lines after its saved offset
        resumed.ingest(as_event(record))
    a, b = whole.snapshot(100.0, 1.0), resumed.snapshot(100.0, 1.0)
    assert b.duplicates == 5
    assert (a.ranks, a.restarts, a.checkpoints) == (b.ranks, b.restarts, b.checkpoints)


@pytest.mark.parametrize("state", [None, {}, {"version": 99}, {"version": 1, "window": 1.0}])
def test_a_state_that_is_not_one_is_refused_with_a_clear_error(state):
    with pytest.raises(ValueError, match="engine state"):
        Engine.from_state(state)


def test_an_empty_engine_snapshots():
    snap = Engine().snapshot(5.0, 6.0)
    assert snap.ranks == () and snap.wall_s == 0 and snap.efficiency is None and snap.journal_lag_s is None
    assert snap.predicted_efficiency is None and snap.restarts.mtbf_s is None


def test_a_job_that_never_saves_keeps_bounded_state_and_every_second():
    pod = Pod()
    p = pod.proc(0)
    p.start(0.0)
    for step in range(1, 10_001):
        p.step(step, float(step), step + 1.0)
    engine = Engine(reorder_window_s=0.0)
    for record in pod.records:
        engine.ingest(as_event(record))
    assert len(engine.to_state()["lanes"]["0"]["ledger"]["pool"]["steps"]) <= 4096
    snap = engine.snapshot(10_001.0, 0.0)
    assert snap.ranks[0].unprotected_s == pytest.approx(10_000.0)
    check_invariant(snap)


@pytest.mark.parametrize("raised", [False, True], ids=["killed from outside", "an exception left the step"])
def test_a_fault_nobody_injected_is_dated_where_the_loop_stopped_and_its_partial_step_is_lost(raised):
    snap = run(stories.killed_from_outside(raised), 20.0, window=0.0)
    (record,) = snap.restarts.recent
    assert record.level is RestartLevel.INJOB
    assert record.fault_wall - 1.7e9 == pytest.approx(5.6, abs=1e-3) and record.duration_s == pytest.approx(8.1 - 5.6)
    rank0, rank1 = snap.ranks
    assert rank0.seconds[L] == pytest.approx(3.0 + 0.6)  # steps 1-3 rolled back by the fresh start, + the partial
    assert rank1.seconds[L] == pytest.approx(3.0)  # stopped by the launcher: its wait is restart, not lost work
    assert rank1.seconds[RS] == pytest.approx(8.1 - 5.0 - 0.1)  # from its last record, less the restore
    assert (record.cause or "").startswith("RuntimeError: boom" if raised else "worker process exited")
    check_invariant(snap)


@pytest.mark.parametrize("raised, marked, why, cause", [
    (False, False, FaultCause.UNKNOWN, "worker process exited"),  # its exit status was not journaled
    (False, True, FaultCause.UNKNOWN, "injected crash"),
    (True, False, FaultCause.EXCEPTION, "RuntimeError: boom"),
    (True, True, FaultCause.EXCEPTION, "RuntimeError: boom"),
], ids=["a worker's exit", "an injected crash", "an exception", "an injected exception"])
def test_a_fault_has_one_cause_the_real_faults_and_a_kill_reads_as_what_was_injected(raised, marked, why, cause):
    """A ``fault_injected`` mark dates the fault it announces, but does not outrank it: the
    exception's own words are the cause; a killed process says nothing of itself, so the mark says
    what was injected. The kind (``why``) is the real fault's either way."""
    snap = run(stories.killed_from_outside(raised, marked), 20.0, window=0.0)
    (record,) = snap.restarts.recent
    assert (record.fault, record.cause) == (why, cause)
    assert record.fault_wall - 1.7e9 == pytest.approx(5.55 if marked else 5.6, abs=1e-3)


def test_a_pod_of_a_many_pod_job_finishes_with_its_own_ranks():
    """One pod of a two-pod job (world size 4, ranks 2 and 3 here): its launcher's exit after its
    ranks' clean ends finishes it, so its last saves and reorder window settle."""
    pod = stories.healthy()
    for record in pod.records:
        if record["rank"] is not None:
            record["rank"] += 2
            record["local_rank"] = record["rank"] - 2
        if record["type"] == "process_start":
            record["world_size"] = 4
    snap = run(pod, 100.0)
    assert snap.finished and [r.rank for r in snap.ranks] == [2, 3]
    assert snap.pod_ranks == 0  # its wall stopped: a pod still running leaves these ranks absent
    assert snap.ranks[0].wall_s == pytest.approx(14.2)  # the launcher's start to its exit


def test_a_rank_read_after_the_launchers_exit_keeps_its_pod_running_until_it_ends():
    """The reader may list a rank's file after reading its launcher's exit (a slow poll). The
    ranks read first say their pod runs two workers, so the pod is not finished on one: finishing
    would settle rank 0's wall, and the late rank 1 would take it back."""
    pod = Pod()
    launcher = pod.launcher(0.0)
    r0, r1 = pod.proc(0), pod.proc(1)
    r0.start(0.54, world_size=2, local_world_size=2)
    r1.start(0.53, world_size=2, local_world_size=2)
    r0.end(1.12)
    r1.end(1.11)
    launcher.ev("launcher_exit", 1.2, code=0)
    early, late = [r for r in pod.records if r["rank"] != 1], [r for r in pod.records if r["rank"] == 1]
    engine = Engine(reorder_window_s=0.0)
    walls = []
    for record in early + late:
        engine.ingest(as_event(record))
        snap = engine.snapshot(1.2, 1.2)
        walls.append((snap.finished, [(r.rank, r.gpu_idle_s) for r in snap.ranks]))
    assert [finished for finished, _ in walls] == [False] * 5 + [True]
    idle = [dict(ranks)[0] for _, ranks in walls if ranks]
    assert idle == sorted(idle)  # never goes down
    assert walls[-1][1] == [(0, pytest.approx(1.2)), (1, pytest.approx(1.2))]  # no step ran: all idle


def test_a_pod_whose_ranks_do_not_say_their_count_finishes_on_the_ranks_read():
    """Journals of hooks older than ``local_world_size``: the pod finishes on the ranks it has read."""
    pod = stories.healthy()
    for record in pod.records:
        record.pop("local_world_size", None)
    assert run(pod, 100.0).finished


def test_a_survivor_restarted_by_its_own_launcher_is_an_in_job_restart_not_a_pod_restart():
    """A pod whose peer pod failed: its launcher restarts its worker for a new rendezvous round and
    keeps the restart count. The same launcher (no new launcher_start) means in-job, from the
    rank's own fault (the failed step) to its first step again."""
    snap = run(stories.survivor_of_another_pods_fault(), 100.0)
    assert snap.finished
    counts = snap.restarts.counts
    assert (counts[RestartLevel.INJOB], counts[RestartLevel.POD], counts[RestartLevel.INPROCESS]) == (1, 0, 0)
    (record,) = snap.restarts.recent
    assert record.duration_s == pytest.approx(8.0 - 5.4)
    assert set(record.phases) >= {RestartPhase.TEARDOWN, RestartPhase.RENDEZVOUS}
    check_invariant(snap)


def test_a_second_relaunch_with_the_same_restart_count_is_a_second_restart():
    """Each rendezvous round its launcher starts the worker in is its own restart (a folded key is
    never reused), and a new launcher (a container restart) is a pod restart."""
    pod = Pod()
    launcher = pod.launcher(0.0)
    t = 1.0
    for _ in range(3):  # three processes under one launcher, restart count 0 throughout
        proc = pod.proc(0)
        proc.start(t, world_size=2, local_world_size=1)
        proc.step(1, t + 1.0, t + 2.0)
        proc.ev("step_failed", t + 2.5, step=2, start=t + 2.0, error="DistBackendError: peer gone")
        launcher.ev("launcher_worker_exit", t + 2.6, worker_pid=proc.pid)
        launcher.ev("launcher_worker_start", t + 3.0)
        t += 3.2
    pod.launcher(t)  # the container restarted: a new launcher, a new process
    proc = pod.proc(0)
    proc.start(t + 0.5, world_size=2, local_world_size=1)
    proc.step(1, t + 1.0, t + 2.0)
    proc.step(2, t + 2.0, t + 3.0)  # a reorder window after the start: it is applied
    snap = run(pod, t + 10.0)
    counts = snap.restarts.counts
    assert (counts[RestartLevel.INJOB], counts[RestartLevel.POD]) == (2, 1)


def test_in_process_restarts_of_a_relaunched_process_count_as_well():
    """The relaunched process keeps the restart count and starts its Wrapper iterations from 0
    again: its in-process restart is a new one, not the earlier process's again."""
    pod = Pod()
    launcher = pod.launcher(0.0)
    t = 1.0
    for _ in range(2):
        proc = pod.proc(0)
        proc.start(t, world_size=2, local_world_size=1)
        proc.step(1, t + 1.0, t + 2.0)
        proc.ev("inprocess_abort", t + 2.2)
        proc.iter = 1
        proc.ev("inprocess_initialize", t + 2.4)
        proc.step(1, t + 2.5, t + 3.0)
        launcher.ev("launcher_worker_exit", t + 3.1, worker_pid=proc.pid)
        launcher.ev("launcher_worker_start", t + 3.5)
        t += 3.7
    proc = pod.proc(0)
    proc.start(t, world_size=2, local_world_size=1)
    proc.step(1, t + 1.0, t + 2.0)
    proc.step(2, t + 2.0, t + 3.0)
    counts = run(pod, t + 10.0).restarts.counts
    assert (counts[RestartLevel.INPROCESS], counts[RestartLevel.INJOB]) == (2, 2)


def test_a_user_span_between_steps_is_its_own_badput_category_by_name_not_unattributed():
    """Steps 1-2 (1 s each from 2.0), an evaluation 4.0-6.5, step 3 from 6.5, a save of step 3."""
    pod = Pod()
    pod.launcher(0.0)
    p = pod.proc(0)
    p.start(1.0, world_size=1, local_world_size=1)
    p.step(1, 2.0, 3.0)
    p.step(2, 3.0, 4.0)
    p.ev("user_span", 6.5, name="eval", start=4.0)
    p.step(3, 6.5, 7.5)
    p.save(3, 7.5, 7.6, written=7.9, observed=8.0)
    p.save_end()
    p.step(4, 7.6, 8.6)
    p.step(5, 8.6, 9.6)
    snap = run(pod, 20.0)
    (rank,) = snap.ranks
    assert rank.seconds[Category.USER_SPAN] == pytest.approx(2.5) and rank.user_spans == {"eval": pytest.approx(2.5)}
    assert rank.seconds[U] == pytest.approx(0.0, abs=1e-9)
    assert rank.seconds[P] == pytest.approx(3.0)
    check_invariant(snap)


def test_user_span_names_past_the_sixteenth_are_summed_as_other():
    pod = Pod()
    p = pod.proc(0)
    p.start(1.0, world_size=1)
    for i in range(20):
        p.ev("user_span", 2.0 + i + 0.5, name=f"probe-{i}", start=2.0 + i)
    p.step(1, 30.0, 31.0)
    spans = run(pod, 40.0).ranks[0].user_spans
    assert len(spans) == 17 and spans["other"] == pytest.approx(4 * 0.5)
    assert sum(spans.values()) == pytest.approx(20 * 0.5)


def test_work_at_risk_is_the_unsettled_time_no_save_read_so_far_keeps_and_none_once_finished():
    """One rank: init to 1 s, steps of 1 s, a save of step 4 durable at 6.5 s, steps to 9 s. While
    the reorder window (10 s) holds every record, all of it is unprotected, but the save already
    read keeps steps 1-4: the rest is at risk (lost, or badput, once settled). Settling moves the
    init into its category and the kept steps into productive; nothing is at risk once finished."""
    pod = Pod()
    launcher = pod.launcher(0.0)
    p = pod.proc(0)
    p.start(0.5, world_size=1, local_world_size=1)
    for step in range(1, 9):
        p.step(step, float(step), step + 1.0)
        if step == 4:
            p.save(4, 5.0, 5.0, 6.0, 6.5)
            p.save_end()
    early = run(pod, 9.5, window=10.0).ranks[0]
    assert sum(early.seconds.values()) == 0.0 and early.unprotected_s == pytest.approx(9.5)
    assert early.at_risk_s == pytest.approx(9.5 - 4.0)
    settled = run(pod, 9.5, window=0.0, records=sorted(pod.records, key=lambda r: r["mono"])).ranks[0]
    assert (settled.seconds[Category.PRODUCTIVE], settled.seconds[Category.INIT]) == pytest.approx((4.0, 1.0))
    assert settled.at_risk_s == pytest.approx(4.5)  # steps 5-8 and the open tail
    p.end(9.2)
    launcher.ev("launcher_exit", 9.3, code=0)
    done = run(pod, 9.5, window=10.0)
    assert done.finished and done.ranks[0].unprotected_s > 0 and done.ranks[0].at_risk_s == 0.0


def test_a_worker_the_rendezvous_renumbered_stays_on_its_accelerators_lane():
    """A pod of one accelerator ran rank 2; after a node loss its launcher's new rendezvous round
    gave the restarted worker rank 3 (a replacement pod joined first). One accelerator, one lane:
    its wall counts once, the pod runs one rank, and a saved state keeps the mapping."""
    pod = Pod()
    launcher = pod.proc(None)
    launcher.ev("launcher_start", 0.0, max_restarts=3, local_world_size=1, world_size=4)
    first, second = pod.proc(2), pod.proc(3)
    first.start(1.0, world_size=4, local_world_size=1)
    first.step(1, 2.0, 3.0)
    launcher.ev("launcher_worker_start", 10.0)
    second.start(11.0, world_size=4, local_world_size=1)
    second.step(2, 12.0, 13.0)
    for record in pod.records:
        if record["rank"] is not None:
            record["local_rank"] = 0
    snap = run(pod, 14.0)
    assert [r.rank for r in snap.ranks] == [2] and snap.pod_ranks == 1
    assert snap.ranks[0].wall_s == pytest.approx(14.0) and snap.ranks[0].steps == 2
    engine = Engine(reorder_window_s=0.5)
    for record in pod.records[:4]:
        engine.ingest(as_event(record))
    resumed = Engine.from_state(json.loads(json.dumps(engine.to_state())))
    for record in pod.records[4:]:
        resumed.ingest(as_event(record))
    assert [r.rank for r in resumed.snapshot(14.0, 14.0 + pod.wall_offset).ranks] == [2]


def test_the_loops_waits_on_a_save_are_blocking_out_of_the_stretch_before_the_record_that_carries_them():
    """An async save of step 1 (7.0-7.2); the loop's polls of its writer come as ``blocked_s`` on the
    next record (0.3 s in a 0.5 s gap before step 2; 0.4 s where step 3's gap holds 0.1 s, the rest
    in its span, as CUDA timing ends a span late) and on the save's end as ``waited_s``."""
    pod = Pod()
    pod.launcher(0.0)
    p = pod.proc(0)
    p.start(1.0, world_size=1, local_world_size=1)
    p.step(1, 6.0, 7.0)
    p.save(1, 7.0, 7.2, written=8.0, observed=9.4)
    p.ev("step", 8.7, step=2, start=7.7, data_s=0.0, compute_s=0.9, optimizer_s=0.1, blocked_s=0.3)
    p.ev("step", 9.8, step=3, start=8.8, data_s=0.2, compute_s=0.7, optimizer_s=0.1, blocked_s=0.4)
    p.ev("checkpoint_end", 9.8, ckpt="step-000001", step=1, ok=True, written=8.0, error=None, waited_s=0.7)
    p.ev("checkpoint_start", 10.5, ckpt="step-000003", step=3, mode="sync", blocked_s=0.2)
    p.ev("checkpoint_scheduled", 10.6, ckpt="step-000003", plan_s=0.0, stage_s=0.1, bytes=10)
    p.ev("checkpoint_end", 10.6, ckpt="step-000003", step=3, ok=True, written=10.6, error=None)
    p.ev("step", 11.6, step=4, start=10.6, data_s=0.0, compute_s=0.9, optimizer_s=0.1)
    snap = run(pod, 20.0)
    (rank,) = snap.ranks
    assert rank.seconds[B] == pytest.approx(0.2 + 0.3 + 0.4 + 0.2 + 0.1)
    assert rank.seconds[U] == pytest.approx(0.2 + 0.5)  # the rest of the gaps before step 2 and the save
    assert rank.seconds[P] == pytest.approx(1.0 + 1.0 + 0.5)  # step 3 lost 0.3 s of its span to the waits
    by_ckpt = {c.ckpt: c for c in snap.checkpoints.recent}
    assert by_ckpt["step-000001"].blocking_s == pytest.approx(0.2 + 0.7)
    check_invariant(snap)


def test_a_negative_wait_is_implausible_and_changes_nothing():
    pod = Pod()
    pod.launcher(0.0)
    p = pod.proc(0)
    p.start(1.0, world_size=1, local_world_size=1)
    p.step(1, 2.0, 3.0)
    clean = run(pod, 10.0)
    p.ev("step", 4.0, step=2, start=3.0, data_s=0.0, compute_s=0.9, optimizer_s=0.1, blocked_s=-5.0)
    p.ev("process_end", 4.5, blocked_s=-1.0)
    dirty = run(pod, 10.0)
    assert dirty.implausible == 2 and dirty.ranks[0].seconds == clean.ranks[0].seconds
