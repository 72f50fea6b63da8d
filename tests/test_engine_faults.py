"""A fault's wake: what a rank spends after the restart's fault instant is that restart's time, not
lost work, on every path a restart takes and in whatever order the records arrive.

The shape was measured under plain torchrun (tests/test_launchers.py, ``torchrun raise``): rank 1
raised right after a durable save, its peer started the next step and sat in gloo's all_reduce
until it failed 1.23 s later, and that wait was booked as lost work, 30 times what the loop's own
clock says was rolled back. ``stories.peer_waits_in_a_collective`` tells it in whole seconds; the
truth is the loop's: each rank did 0.5 s of work between the save and the fault.
"""

from __future__ import annotations

import random

import pytest

import stories
from journal_builder import Pod
from nvrx_slo.contracts.catalogue import Category, FaultCause, RestartLevel
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.engine.snapshot import Snapshot
from nvrx_slo.exporter.events import as_event

L, RS, SD = Category.LOST, Category.RESTART, Category.SHUTDOWN
WORK_BEFORE_FAULT = 0.5  # per rank: the save ended at 5.1, rank 1 raised at 5.6
RESTART = 3.1  # per rank: 5.6 → 9.0 (both ranks' first step again), less the restore's 0.3


def _under_our_launcher() -> Pod:
    """The story under ``nvrx-slo ft-launcher``: it sees rank 1 exit at 7.0, detects the failure
    at 7.1 and stops rank 0 (whose collective failed at 7.05), and starts both again at 7.8."""
    pod = stories.peer_waits_in_a_collective()
    records = [r for r in pod.records if r["type"] != "process_end" or r["restart"] == 1]
    for r in records:
        if r["type"] == "step_failed" and r["rank"] == 0:
            r["mono"], r["wall"] = 7.05, 7.05 + pod.wall_offset
    pod.records = records
    launcher = pod.launcher(0.0)
    ranks = {r["rank"]: r["pid"] for r in records if r["type"] == "process_start" and r["restart"] == 0}
    launcher.ev("launcher_worker_exit", 7.0, worker_pid=ranks[1], exit_code=1)
    launcher.ev("launcher_failure_detected", 7.1)
    launcher.ev("launcher_worker_exit", 7.2, worker_pid=ranks[0], signal=15)
    for kind, mono in (("launcher_workers_terminated", 7.3), ("launcher_rendezvous_done", 7.6),
                       ("launcher_worker_start", 7.8)):
        launcher.ev(kind, mono)
    launcher.ev("launcher_exit", 11.0, code=0)
    return pod


def _in_process() -> Pod:
    """The story under NVRx's in-process Wrapper: one process per rank; the monitors abort at
    5.7 / 6.2, rank 0's collective fails at 7.3 (gloo cannot be aborted), and the Wrapper
    finalizes, reassigns and re-initialises (iteration 1) before the restore at 8.2."""
    pod = Pod()
    ranks = [pod.proc(r) for r in range(2)]
    for p in ranks:
        p.start(1.0, local_world_size=2)
    t = 2.0
    for step in (1, 2, 3):
        for p in ranks:
            p.step(step, t, t + 1.0)
        t += 1.0
    for p in ranks:
        p.save(3, 5.0, 5.1, written=5.1, observed=5.1, mode="sync")
        p.save_end()
    ranks[1].ev("step_failed", 5.6, step=4, start=5.1, error="RuntimeError: planted at step 4")
    ranks[1].ev("inprocess_abort", 5.7)
    ranks[0].step(4, 5.1, 6.1)
    ranks[0].ev("inprocess_abort", 6.2)
    ranks[0].ev("step_failed", 7.3, step=5, start=6.1, error="DistBackendError: timeout")
    for p in ranks:
        p.ev("inprocess_finalize", 7.4, cause="RuntimeError: planted at step 4")
        p.ev("inprocess_rank_assignment", 7.5, cause="rank 1: EXCEPTION")
        p.iter = 1
        p.ev("inprocess_initialize", 7.6)
        p.restore(3, 8.2, 8.5)
        p.step(4, 9.0, 10.0)
        p.save(4, 10.0, 10.1, written=10.1, observed=10.1, mode="sync")
        p.save_end()
        p.ev("inprocess_completion", 10.4)
        p.end(10.5)
    return pod


PATHS = {"plain torchrun": (stories.peer_waits_in_a_collective, RestartLevel.INJOB),
         "our ft-launcher": (_under_our_launcher, RestartLevel.INJOB),
         "in-process Wrapper": (_in_process, RestartLevel.INPROCESS)}


def _feed(records: list[dict], window: float = 0.5, now: float = 20.0, every: bool = False) -> list[Snapshot]:
    engine = Engine(reorder_window_s=window)
    snaps = []
    for record in records:
        engine.ingest(as_event(record))
        if every:
            snaps.append(engine.snapshot(record["mono"], record["wall"]))
    return [*snaps, engine.snapshot(now, now)]


def _check(snap: Snapshot) -> None:
    for r in snap.ranks:
        assert sum(r.seconds.values()) + r.unprotected_s == pytest.approx(r.wall_s, abs=1e-9), r.rank
        assert r.seconds[L] <= WORK_BEFORE_FAULT + 1e-9, (r.rank, r.seconds)  # never more than the truth, live


@pytest.mark.parametrize("path", PATHS)
def test_a_peer_waiting_in_a_collective_after_the_fault_is_restarting_not_losing_work(path):
    build, level = PATHS[path]
    snap = _feed(build().records)[-1]
    assert snap.finished and snap.failure is None
    (restart,) = snap.restarts.recent
    assert (restart.level, restart.fault, restart.ranks) == (level, FaultCause.EXCEPTION, 2)
    assert restart.duration_s == pytest.approx(9.0 - 5.6)
    for r in snap.ranks:
        assert r.seconds[L] == pytest.approx(WORK_BEFORE_FAULT), (r.rank, r.seconds)
        assert r.seconds[RS] == pytest.approx(RESTART), (r.rank, r.seconds)
    # the restart's record: rank 0's work after the save that its restore rolled back, up to the
    # fault; both ranks' time from the fault to their first step again, restore excluded
    assert restart.lost_s == pytest.approx(WORK_BEFORE_FAULT)
    assert restart.restart_s == pytest.approx(2 * RESTART)
    assert snap.caused == pytest.approx({(L, FaultCause.EXCEPTION): 2 * WORK_BEFORE_FAULT,
                                         (RS, FaultCause.EXCEPTION): 2 * RESTART})


def test_a_process_that_ends_after_its_fault_is_restarting_not_shutting_down():
    """Rank 1's interpreter exits 1.4 s after its exception (5.6 → 7.0): the restart's time; only
    the restarted round's clean end is shutdown (10.1 → 10.5)."""
    snap = _feed(stories.peer_waits_in_a_collective().records)[-1]
    assert [r.seconds[SD] for r in snap.ranks] == pytest.approx([0.4, 0.4])


@pytest.mark.parametrize("path", PATHS)
def test_the_wake_is_decided_alike_in_any_arrival_order_and_never_booked_lost_on_the_way(path):
    """Each rank's stream whole before the other's, either way round (a snapshot after every record:
    none books more lost than the truth), records jittered within the window, and shuffles that a
    window covering the journal puts back in order: the final snapshots agree."""
    records = PATHS[path][0]().records
    by_rank = [[r for r in records if r["rank"] == rank] for rank in (0, 1)]
    launcher = [r for r in records if r["rank"] is None]
    rng = random.Random(34)
    finals = []
    for order in (launcher + by_rank[0] + by_rank[1], launcher + by_rank[1] + by_rank[0]):
        snaps = _feed(order, window=20.0, every=True)
        for snap in snaps:
            _check(snap)
        finals.append(snaps[-1])
    for _ in range(4):
        snaps = _feed(sorted(records, key=lambda r: r["mono"] + rng.uniform(0.0, 0.3)), every=True)
        for snap in snaps:
            _check(snap)
        finals.append(snaps[-1])
        finals.append(_feed(rng.sample(records, len(records)), window=20.0)[-1])
    for final in finals:
        _check(final)
        assert [r.seconds for r in final.ranks] == [pytest.approx(r.seconds) for r in finals[0].ranks]
        assert final.caused == pytest.approx(finals[0].caused)


def test_the_sidecars_live_snapshot_holds_the_wake_unprotected_until_the_restart_is_decided():
    """Read live: once rank 0's collective failed and its process ended, its wait is unprotected, not
    lost; once the restart folded (every rank a window past its first step again), the job still
    running, each rank's lost is its work before the fault and the rest is the restart's."""
    records = [r for r in stories.peer_waits_in_a_collective().records if r["mono"] <= 10.1]
    waiting = [r for r in records if r["mono"] <= 8.0]
    snap = _feed(waiting, now=8.0)[-1]
    assert not snap.finished and snap.seconds[L] == 0.0 and snap.unprotected_s > 2 * 1.2
    snap = _feed(records, window=0.05, now=10.1)[-1]
    assert not snap.finished and snap.restarts.recent[-1].duration_s == pytest.approx(3.4)
    assert [r.seconds[L] for r in snap.ranks] == pytest.approx([WORK_BEFORE_FAULT] * 2)
    assert [r.seconds[RS] for r in snap.ranks] == pytest.approx([RESTART] * 2)


def test_a_state_saved_in_the_wake_resumes_to_the_same_result():
    records = stories.peer_waits_in_a_collective().records
    whole = _feed(records)[-1]
    for cut in range(1, len(records)):
        engine = Engine(reorder_window_s=0.5)
        for record in records[:cut]:
            engine.ingest(as_event(record))
        engine = Engine.from_state(engine.to_state())
        for record in records[cut:]:
            engine.ingest(as_event(record))
        resumed = engine.snapshot(20.0, 20.0)
        assert [r.seconds for r in resumed.ranks] == [pytest.approx(r.seconds) for r in whole.ranks], cut
