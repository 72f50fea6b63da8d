"""The job from its pods' snapshots: time adds up, one restart per fault however many pods saw it."""

from __future__ import annotations

import dataclasses
import re

import pytest

from nvrx_slo.contracts.catalogue import Category, RestartLevel, RestartPhase
from nvrx_slo.exporter.engine.snapshot import CheckpointRecord, RankState, RestartRecord, Snapshot
from nvrx_slo.exporter.offline import rollup
from nvrx_slo.exporter.views import slo_report, status_page
from nvrx_slo.exporter.views.view import View
from snapshot_fixtures import TARGETS, rank, snapshot

T0 = 1.7e9
IN, IJ, POD = RestartLevel.INPROCESS, RestartLevel.INJOB, RestartLevel.POD
D, TD, RV, RI, RS = RestartPhase.DETECT, RestartPhase.TEARDOWN, RestartPhase.RENDEZVOUS, RestartPhase.REINIT, \
    RestartPhase.RESTORE


def pod(name: str, ranks: list[int], records: list[RestartRecord], wall: float = 100.0, **kw: object) -> Snapshot:
    kw.setdefault("world_size", None)
    snap = snapshot(pod=name, ranks=tuple(rank(r, wall=wall, productive=wall * 0.9) for r in ranks), **kw)
    return dataclasses.replace(snap, restarts=dataclasses.replace(snap.restarts, recent=tuple(records)))


def rec(level: RestartLevel, fault: float, duration: float | None, phases: dict | None = None,
        cause: str | None = None, journaled: bool = True) -> RestartRecord:
    return RestartRecord(level, cause, T0 + fault, duration, phases or {}, 1, journaled)


def test_one_fault_seen_by_every_pod_is_one_restart_at_the_most_disruptive_level():
    """Pod 1's worker crashed (in-job); pod 0's rank failed its collective, tried in-process, and its
    launcher restarted it for the new rendezvous round (in-job); pod 2 was restarted by its
    launcher only. One restart: pod 1's fault to the last pod back."""
    pods = [pod("pod-0", [0], [rec(IN, 10.1, 1.5, cause="RuntimeError: gloo"),
                               rec(IJ, 11.8, 11.0, {TD: 0.3, RV: 1.3, RI: 5.4, RS: 4.0})]),
            pod("pod-1", [1], [rec(IJ, 10.0, 12.5, {D: 0.5, TD: 0.1, RV: 2.9, RI: 5.0, RS: 4.0},
                                   cause="fault_injected: crash")]),
            pod("pod-2", [2], [rec(IJ, 10.4, 12.2, {TD: 0.4, RV: 2.0, RI: 5.0, RS: 4.8})])]
    (merged,) = rollup.merge_restarts(pods)
    r = merged.record
    assert (r.level, r.fault_wall, r.cause, merged.pods) == (IJ, T0 + 10.0, "fault_injected: crash",
                                                             ("pod-1", "pod-0", "pod-2"))
    assert r.duration_s == pytest.approx(22.8 - 10.0)  # pod 0 came back last, at 11.8 + 11.0
    assert sum(r.phases.values()) == pytest.approx(r.duration_s)
    assert list(r.phases) == [D, TD, RV, RI, RS]  # pod 0 had no detect phase: the job's lead-in is it
    assert r.phases[D] == pytest.approx(1.8) and r.phases[RI] == pytest.approx(5.4)


def test_faults_apart_are_restarts_apart_and_an_open_one_takes_every_later_record():
    pods = [pod("pod-0", [0], [rec(IN, 10.0, 2.0), rec(IJ, 50.0, 5.0), rec(IJ, 80.0, None)]),
            pod("pod-1", [1], [rec(IN, 10.2, 1.9), rec(IJ, 50.1, 4.0), rec(IJ, 200.0, 3.0)])]
    merged = rollup.merge_restarts(pods)
    assert [(m.record.level, m.record.fault_wall - T0, m.record.duration_s) for m in merged] == [
        (IN, 10.0, pytest.approx(2.1)), (IJ, 50.0, pytest.approx(5.0)), (IJ, 80.0, None)]
    assert merged[-1].pods == ("pod-0", "pod-1")


def test_the_job_snapshot_adds_up_its_pods_and_counts_restarts_once():
    pods = [pod("pod-0", [0, 1], [rec(IJ, 10.0, 3.0)], finished=True, world_size=4),
            pod("pod-1", [2, 3], [rec(IJ, 10.1, 4.0)], finished=True, world_size=4)]
    snap = rollup.job_snapshot(pods)
    assert [r.rank for r in snap.ranks] == [0, 1, 2, 3] and snap.finished
    assert snap.wall_s == sum(p.wall_s for p in pods)
    assert snap.seconds[Category.PRODUCTIVE] == sum(p.seconds[Category.PRODUCTIVE] for p in pods)
    assert snap.efficiency == pytest.approx(sum(p.seconds[Category.PRODUCTIVE] for p in pods) / snap.wall_s)
    assert snap.restarts.counts[IJ] == 1 and snap.restarts.duration[IJ].sum == pytest.approx(4.1)
    assert snap.checkpoints.blocking.count == 2 * pods[0].checkpoints.blocking.count
    assert not rollup.job_snapshot([pods[0], dataclasses.replace(pods[1], finished=False)]).finished


def test_the_job_report_names_its_pods_and_judges_the_job():
    pods = [pod("pod-0", [0], [rec(IJ, 10.0, 3.0)]), pod("pod-1", [1], [rec(IJ, 10.1, 30.0)])]
    text = slo_report.render(rollup.job_snapshot(pods), TARGETS)
    assert "2 pods (pod-0, pod-1), 2 rank(s)" in text
    assert "injob     1 restart(s), mean 30.10 s" in text
    assert "FAIL     recovery latency: 0.0%" in text


def test_a_job_of_no_pods_is_an_error():
    with pytest.raises(ValueError, match="at least one pod"):
        rollup.job_snapshot([])


def test_a_journaled_fault_starts_the_job_restart_not_a_survivors_last_record_before_it():
    """The survivor's in-process restart began at its last step's end (a bound, journaled nothing
    of the fault); the failing pod journaled its exception later. The job's fault is the exception."""
    pods = [pod("pod-0", [0], [rec(IN, 47.3, 3.5, {D: 1.3, RS: 2.2}, cause="RuntimeError: gloo timeout",
                                   journaled=False)]),
            pod("pod-1", [1], [rec(IN, 47.6, 3.1, {D: 1.0, RS: 2.1}, cause="fault_injected: exception")])]
    (merged,) = rollup.merge_restarts(pods)
    r = merged.record
    assert (r.fault_wall, r.cause, r.fault_journaled) == (T0 + 47.6, "fault_injected: exception", True)
    assert r.duration_s == pytest.approx(50.8 - 47.6)  # pod 0 back last, at 47.3 + 3.5
    assert r.phases == {D: pytest.approx(1.0), RS: pytest.approx(2.2)}  # pod 0's, less the 0.3 s before 47.6
    assert sum(r.phases.values()) == pytest.approx(r.duration_s)


def test_a_lost_pod_is_absent_until_its_replacement_runs_its_rank_and_the_replacement_finishes_the_job():
    """World size 2 over 100 s: pod-0 ran rank 0 throughout; pod-1 ran rank 1 for 30 s and was lost
    (its sidecar's last snapshot: not finished); its replacement ran rank 1 from 50 s to the end.
    Rank 1's 20 s in no pod are absent, and badput: the job's wall is 2 x 100 s."""
    pods = [pod("pod-0", [0], [], wall=100.0, finished=True, world_size=2, job_start_wall=T0),
            pod("pod-1", [1], [], wall=30.0, finished=False, world_size=2, job_start_wall=T0),
            pod("pod-1-replacement", [1], [], wall=50.0, finished=True, world_size=2, job_start_wall=T0 + 50)]
    snap = rollup.job_snapshot(pods)
    assert snap.absent_s == pytest.approx(20.0) and snap.wall_s == pytest.approx(200.0)
    assert snap.efficiency == pytest.approx(0.9 * 180.0 / 200.0)
    assert snap.finished  # rank 1 ended in the replacement
    assert rollup.job_snapshot([*pods[:1], dataclasses.replace(pods[1], checkpoints=dataclasses.replace(
        pods[1].checkpoints, saves=0)), pods[2]], lost={"pod-1"}).checkpoints.saves == 3  # not the lost pod's 0
    text = slo_report.render(snap, TARGETS)
    assert re.search(r"^  absent \(no pod ran the rank\)\s+20\.00 s\s+10\.00%$", text, re.M)
    assert not rollup.job_snapshot(pods[:2]).finished  # before the replacement: rank 1 never ended
    # the new rendezvous gave the replacement rank 0 and pod-0's restarted worker rank 1: each
    # pod's lane keeps the rank its accelerator first ran, and the job still ends
    renumbered = [pods[0], pods[1], dataclasses.replace(pods[2], ranks=(rank(0, wall=50.0, productive=45.0),))]
    assert rollup.job_snapshot(renumbered).finished
    assert rollup.job_snapshot(pods[:1]).absent_s == pytest.approx(100.0)  # a pod not started yet is absent too


def test_a_job_whose_world_size_is_unknown_counts_nothing_absent():
    snap = rollup.job_snapshot([pod("pod-0", [0], [], world_size=None)])
    assert snap.absent_s == 0.0 and snap.wall_s == pytest.approx(100.0)


def test_a_lost_pods_unsettled_time_is_productive_where_its_saves_keep_it_and_lost_elsewhere():
    """pod-1 (rank 1) was lost with 12 s unprotected, of which a save it journaled keeps 7 s (its
    reorder window had not settled them): 7 s productive, the 5 s at risk lost. A pod not named
    lost keeps its own accounting."""
    lost = pod("pod-1", [1], [], wall=30.0, world_size=2, job_start_wall=T0)
    lost = dataclasses.replace(lost, ranks=(rank(1, wall=30.0, productive=10.0, unprotected=12.0, at_risk=5.0),))
    survivor = pod("pod-0", [0], [], wall=100.0, world_size=2, job_start_wall=T0, finished=True)
    before = lost.ranks[0].seconds
    (settled,) = [r for r in rollup.job_snapshot([survivor, lost], lost={"pod-1"}).ranks if r.rank == 1]
    assert (settled.unprotected_s, settled.at_risk_s) == (0.0, 0.0)
    assert settled.seconds[Category.PRODUCTIVE] == pytest.approx(before[Category.PRODUCTIVE] + 7.0)
    assert settled.seconds[Category.LOST] == pytest.approx(before[Category.LOST] + 5.0)
    assert sum(settled.seconds.values()) == pytest.approx(settled.wall_s)
    (kept,) = [r for r in rollup.job_snapshot([survivor, lost]).ranks if r.rank == 1]
    assert (kept.unprotected_s, kept.seconds) == (12.0, before)


def test_a_replacement_pod_that_starts_during_the_restart_ends_it_with_its_first_step():
    """pod-1 lost at ~10 s; the survivor's in-job restart runs 10.0-30.0; pod-1-replacement starts at
    18 s (no restart of its own: a first process) and steps from 31.5. The job trains again at 31.5."""
    survivor = pod("pod-0", [0], [rec(IJ, 10.0, 20.0, {D: 1.0, TD: 1.0, RV: 15.0, RI: 2.0, RS: 1.0})],
                   world_size=2, job_start_wall=T0)
    replacement = pod("pod-1-replacement", [1], [], wall=50.0, world_size=2, job_start_wall=T0 + 18.0)
    replacement = dataclasses.replace(replacement, ranks=(dataclasses.replace(
        replacement.ranks[0], first_step_wall=T0 + 31.5),))
    (merged,) = rollup.merge_restarts([survivor, replacement])
    assert merged.record.duration_s == pytest.approx(21.5) and merged.pods == ("pod-0", "pod-1-replacement")
    assert merged.record.phases[RS] == pytest.approx(2.5)
    assert sum(merged.record.phases.values()) == pytest.approx(21.5)
    # a pod that started before the fault is not a replacement: its own record (or none) speaks for it
    early = dataclasses.replace(replacement, pod="pod-2", job_start_wall=T0)
    (alone,) = rollup.merge_restarts([survivor, early])
    assert alone.record.duration_s == pytest.approx(20.0)


def test_a_pod_the_job_restored_without_is_lost_and_a_pod_that_merely_stopped_is_not():
    """Read from journals after the fact: pod-1 (not finished, last record at 30 s) is lost once
    another pod's rank restored after 30 s; a pod whose journal ends with the others' is not."""
    survivor = pod("pod-0", [0], [], wall=100.0, world_size=2, job_start_wall=T0, finished=True)
    restored = dataclasses.replace(survivor, ranks=(dataclasses.replace(
        survivor.ranks[0], last_restore_wall=T0 + 45.0),))
    gone = pod("pod-1", [1], [], wall=30.0, world_size=2, job_start_wall=T0, finished=False)
    assert rollup.lost_pods([restored, gone]) == {"pod-1"}
    assert rollup.lost_pods([survivor, gone]) == set()  # no restore after it: the job did not go on without it
    assert rollup.lost_pods([restored, dataclasses.replace(gone, finished=True)]) == set()
    copied_mid_run = dataclasses.replace(gone, ranks=(dataclasses.replace(gone.ranks[0], wall_s=100.0),))
    assert rollup.lost_pods([restored, copied_mid_run]) == set()


def save(ckpt: str, began: float, ok: bool | None, incarnation: tuple[int, int] = (0, 0),
         blocking: float = 0.1) -> CheckpointRecord:
    return CheckpointRecord(ckpt, int(ckpt[5:]), "async", blocking, 0.5 if ok else None, ok, 100,
                            T0 + began + 0.6 if ok else None, 1, incarnation, T0 + began)


def _node_loss() -> list[Snapshot]:
    """pod-1 is lost at 15 s while its share of step-9's save is still writing: pod-0's share fails
    (abandoned at its fault), the job restarts in-job at 16 s (pod-0's restart count goes to 1) and
    pod-1-replacement (a first process: restart 0) saves step 9 again with pod-0, then step 19."""
    restart = rec(IJ, 16.0, 12.0)
    survivor = pod("pod-0", [0], [restart], world_size=2, job_start_wall=T0, finished=True,
                   node="node-a", checkpoints=dataclasses.replace(snapshot().checkpoints, saves=2, failures=1, recent=(
                       save("step-9", 9.0, False), save("step-9", 30.0, True, (1, 0)),
                       save("step-19", 40.0, True, (1, 0), blocking=0.3))))
    lost = pod("pod-1", [1], [], wall=15.0, world_size=2, job_start_wall=T0, node="node-b",
               checkpoints=dataclasses.replace(snapshot().checkpoints, recent=(save("step-9", 9.1, None),)))
    replacement = pod("pod-1-replacement", [1], [], wall=35.0, world_size=2, job_start_wall=T0 + 20.0, finished=True,
                      node="node-b", checkpoints=dataclasses.replace(snapshot().checkpoints, recent=(
                          save("step-9", 30.0, True), save("step-19", 40.1, True))))
    return [survivor, lost, replacement]


def test_the_pods_shares_of_a_save_between_two_job_restarts_are_one_save_as_good_as_its_worst_share():
    survivor, lost, replacement = _node_loss()
    merged = rollup.merge_checkpoints([p.checkpoints.recent for p in (survivor, lost, replacement)],
                                   [m.record for m in rollup.merge_restarts([survivor, lost, replacement])])
    assert [(c.ckpt, c.ok, c.ranks) for c in merged] == [("step-9", False, 2), ("step-9", True, 2),
                                                          ("step-19", True, 2)]
    assert merged[2].blocking_s == 0.3 and merged[2].began_wall == T0 + 40.0 and merged[2].bytes == 200
    # without the survivor's failed share, the lost pod's share that never ended leaves the save unfinished
    (alone,) = rollup.merge_checkpoints([[save("step-9", 9.0, True)], lost.checkpoints.recent], [])
    assert alone.ok is None


def test_a_job_with_a_lost_pod_lists_its_saves_names_each_ranks_pod_and_shows_the_lost_rank_lost():
    snap = rollup.job_snapshot(_node_loss(), lost={"pod-1"})
    assert [(c.ckpt, c.ok) for c in snap.checkpoints.recent] == [("step-9", False), ("step-9", True),
                                                                  ("step-19", True)]
    assert snap.node == "node-a, node-b"
    assert [(r.rank, r.pod, r.state) for r in snap.ranks] == [
        (0, "pod-0", RankState.TRAINING), (1, "pod-1", RankState.LOST), (1, "pod-1-replacement", RankState.TRAINING)]
    assert snap.ranks[1].worker_alive is False  # its checkpoint worker went with its node
    text = slo_report.render(snap, TARGETS)
    saves = text.split("latest saves")[1].split("Restart latency")[0]
    assert re.findall(r"^    (step-\d+)\s+step (\d+)\s.*\s(durable|FAILED)$", saves, re.M) == [
        ("step-9", "9", "FAILED"), ("step-9", "9", "durable"), ("step-19", "19", "durable")]
    page = status_page.render(View(snap, {}, {}, {}), TARGETS)
    assert "No checkpoint yet" not in page and page.count("<tr data-ckpt=") == 3
    assert "node <b>node-a, node-b</b>" in page and 'id="ranks" class="" data-value="2"' in page
    rows = re.findall(r'<tr data-rank="(\d)" data-pod="([^"]*)"><td>\d</td><td>[^<]*</td><td>(\w+)</td>'
                      r'(?:<td[^>]*>[^<]*</td>){4}<td>(\w+)</td>', page)
    assert rows == [("0", "pod-0", "training", "alive"), ("1", "pod-1", "lost", "lost"),
                    ("1", "pod-1-replacement", "training", "DEAD")]  # the fixture's rank 1 worker died
    assert ">rank 1 · pod-1 (lost)<" in page and ">rank 1 · pod-1-replacement<" in page  # the bars' labels
