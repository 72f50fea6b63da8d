"""The end of a job launched any way (torchrun, srun, plain ``python``, our launcher), on
hand-built journals: when it is over, how it ended, and that nothing is held back or taken back."""

from __future__ import annotations

from typing import Any

import pytest

from journal_builder import Pod, Proc
from nvrx_slo.contracts.catalogue import Category, RestartLevel
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.engine.snapshot import Snapshot
from nvrx_slo.exporter.events import as_event

P, L, SD, RS = Category.PRODUCTIVE, Category.LOST, Category.SHUTDOWN, Category.RESTART
WINDOW = 10.0  # the sidecar's default: longer than every story below, so only an end settles


def start(p: Proc, mono: float, *, world: int = 2, local: int | None = 2, max_restarts: int | None = None) -> None:
    p.ev("process_start", mono, world_size=world, local_world_size=local, max_restarts=max_restarts)


def train(p: Proc, first: int, last: int, t: float, save_every: int = 5) -> float:
    """Steps of 0.1 s, a synchronous save of 0.02 s after every ``save_every``-th and the last."""
    for n in range(first, last + 1):
        p.step(n, t, t + 0.1)
        t += 0.1
        if (n + 1) % save_every == 0 or n == last:
            p.save(n, t, t + 0.02, t + 0.02, t + 0.02, mode="sync")
            p.save_end()
            t += 0.02
    return t


def engine_of(records: list[dict[str, Any]]) -> Engine:
    engine = Engine(reorder_window_s=WINDOW)
    for record in records:
        engine.ingest(as_event(record))
    return engine


def snap(records: list[dict[str, Any]], now: float) -> Snapshot:
    return engine_of(records).snapshot(now, now + 1.7e9)


def python_job(ranks: int = 1, steps: int = 20, error: str | None = None) -> tuple[Pod, float]:
    """``ranks`` processes without a launcher of ours; returns the pod and its last instant."""
    pod = Pod()
    procs = [pod.proc(r) for r in range(ranks)]
    ends = []
    for p in procs:
        start(p, 1.0, world=ranks, local=ranks if ranks > 1 else None)
        t = train(p, 0, steps - 1, 1.5)
        p.ev("process_end", t + 0.05, error=error if p.rank == ranks - 1 else None)
        ends.append(t + 0.05)
    return pod, max(ends)


def test_plain_python_is_finished_at_its_end_with_nothing_held_back():
    pod, end = python_job(ranks=2)
    s = snap(pod.records, end + 0.01)
    assert s.finished and s.failure is None and s.state == "finished"
    for r in s.ranks:
        assert r.wall_s == pytest.approx(end - 1.0)
        assert r.unprotected_s == 0.0 and r.at_risk_s == 0.0
        assert r.seconds[P] == pytest.approx(20 * 0.1)  # every step, although all lie within the window
    assert s.checkpoints.saves == 4 and s.checkpoints.in_flight == 0
    assert [c.ok for c in s.checkpoints.recent] == [True] * 4  # the rows agree with the count


def test_a_finished_job_accrues_nothing_however_late_it_is_read():
    pod, end = python_job(ranks=2)
    at_end, an_hour_later = snap(pod.records, end), snap(pod.records, end + 3600.0)
    assert at_end.ranks == an_hour_later.ranks and at_end.wall_s == pytest.approx(2 * (end - 1.0))


def test_a_one_second_job_reports_without_contradictions():
    pod, end = python_job(ranks=1, steps=5)
    s = snap(pod.records, end)
    assert s.finished and s.wall_s == pytest.approx(end - 1.0)
    assert sum(s.seconds.values()) + s.unprotected_s == pytest.approx(s.wall_s)
    assert s.checkpoints.saves == sum(c.ok is True for c in s.checkpoints.recent) == 1


def test_a_process_that_exited_by_an_exception_fails_the_job_and_says_how():
    pod, end = python_job(ranks=2, error="RuntimeError: boom")
    s = snap(pod.records, end)
    assert s.finished and s.failure == "rank 1: RuntimeError: boom"
    assert s.state == "failed (rank 1: RuntimeError: boom)"


def test_a_killed_process_journals_no_end_so_the_job_runs_until_the_reader_settles():
    pod, _ = python_job(ranks=2)
    records = [r for r in pod.records if not (r["rank"] == 1 and r["type"] == "process_end")]
    engine = engine_of(records)
    running = engine.snapshot(100.0, 1.7e9 + 100)
    assert not running.finished and running.ranks[1].unprotected_s > 0
    engine.settle()  # the reader's last read: every buffer applied, the job still not over
    settled = engine.snapshot(100.0, 1.7e9 + 100)
    assert not settled.finished and settled.ranks[1].seconds[P] == pytest.approx(2.0)


def test_a_rank_not_read_yet_keeps_the_pod_running():
    pod, end = python_job(ranks=2)
    assert not snap([r for r in pod.records if r["rank"] == 0], end).finished  # LOCAL_WORLD_SIZE says 2


def torchrun_job(max_restarts: int, failed: int, recovers: bool) -> Pod:
    """Two ranks under torchrun: in each of ``failed`` rounds rank 1 raises at step 7 (it journals
    ``step_failed`` and, at exit, its end with the exception) and rank 0 leaves its collective with
    the peer's error; then, if it ``recovers``, a round that trains to the end."""
    pod = Pod()
    t = 1.0
    for restart in range(failed + recovers):
        procs = [pod.proc(r, restart=restart) for r in range(2)]
        for p in procs:
            start(p, t, max_restarts=max_restarts)
            p.restore(None if restart == 0 else 4, t + 0.1, t + 0.2)
        clean = restart == failed
        first = 0 if restart == 0 else 5
        end = 0.0
        for p in procs:
            u = train(p, first, 9 if clean else 6, t + 0.3)
            if clean:
                p.ev("process_end", u + 0.05)
            else:
                error = "RuntimeError: boom" if p.rank == 1 else "RuntimeError: Connection closed by peer"
                p.ev("step_failed", u + 0.05 + 0.01 * (1 - p.rank), step=7, start=u, error=error)
                p.ev("process_end", u + 0.1, error=error)
            end = max(end, u + 0.1)
        t = end + 2.0  # the agent's restart: detection, teardown, a new rendezvous, new processes
    return pod


def test_a_torchrun_round_that_failed_with_restarts_left_is_not_over():
    pod = torchrun_job(max_restarts=1, failed=1, recovers=False)
    assert not snap(pod.records, 100.0).finished


def test_a_torchrun_job_restarted_once_finishes_with_one_restart_from_the_fault_to_the_first_step():
    pod = torchrun_job(max_restarts=1, failed=1, recovers=True)
    s = snap(pod.records, 100.0)
    assert s.finished and s.failure is None
    assert s.restarts.counts[RestartLevel.INJOB] == 1
    (restart,) = s.restarts.recent
    fault = next(r for r in pod.records if r["type"] == "step_failed" and r["rank"] == 1)
    first = min(r["start"] for r in pod.records if r["type"] == "step" and r["restart"] == 1)
    assert restart.fault_wall == pytest.approx(fault["wall"]) and restart.duration_s == pytest.approx(
        first - fault["mono"])
    assert all(r.unprotected_s == 0.0 for r in s.ranks)


def test_a_torchrun_job_out_of_restarts_failed():
    for max_restarts in (0, 1):
        s = snap(torchrun_job(max_restarts=max_restarts, failed=max_restarts + 1, recovers=False).records, 100.0)
        assert s.finished and s.failure == "rank 0: RuntimeError: Connection closed by peer"
        assert s.restarts.counts[RestartLevel.INJOB] == max_restarts


def test_our_launcher_exiting_with_an_error_ends_the_job_as_failed():
    pod = torchrun_job(max_restarts=0, failed=1, recovers=False)
    launcher = pod.launcher(0.5)
    launcher.ev("launcher_exit", max(r["mono"] for r in pod.records) + 0.5, code=1)
    s = snap(pod.records, 100.0)
    assert s.finished and s.failure == "launcher exited with code 1"


def test_settled_is_settled_a_job_that_runs_again_takes_back_nothing():
    """A round torchrun starts after all (a worker that failed after its clean end) or a rerun in
    the same directory: the job runs again from where its end settled it, and no counter goes down."""
    pod, end = python_job(ranks=1)
    engine = engine_of(pod.records)
    over = engine.snapshot(end + 5.0, 1.7e9)
    again = pod.proc(0, restart=1)
    start(again, end + 3.0, world=1, local=None)
    again.step(20, end + 3.5, end + 3.6)
    for record in pod.records[-2:]:
        engine.ingest(as_event(record))
    running = engine.snapshot(end + 6.0, 1.7e9)
    assert over.finished and not running.finished
    for before, after in zip(over.ranks, running.ranks, strict=True):
        assert after.wall_s >= before.wall_s
        for category, seconds in before.seconds.items():
            assert after.seconds[category] >= seconds - 1e-9, category
    engine.settle()
    assert engine.snapshot(end + 6.0, 1.7e9).restarts_total == 1


def test_the_state_saved_after_the_end_is_the_settled_one():
    pod, end = python_job(ranks=2)
    engine = engine_of(pod.records)
    first = engine.snapshot(end, 1.7e9)
    resumed = Engine.from_state(engine.to_state()).snapshot(end + 60.0, 1.7e9)
    assert resumed.ranks == first.ranks and all(not lane["pending"] for lane in engine.to_state()["lanes"].values())
