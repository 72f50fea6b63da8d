"""Each fault's cause, decided once by the engine, from hand-built journals of the records the real
parts write (the real launcher, Wrapper and a pod stopped by the kubelet: tests/test_fault_dating.py
and tests/test_demo_command.py).

A two-rank pod under its launcher: rank 1 faults at 3.0 s in the middle of its step, each way a fault
can come; the launcher restarts both workers (the in-job restart's cause is decided from rank 1's
fault, and rank 0, stopped by the launcher, pays its restart seconds to the same cause). Every lost
and restart second of the finished pod has that cause.
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from journal_builder import Pod, Proc
from nvrx_slo.contracts.catalogue import Category, FaultCause, RestartLevel
from nvrx_slo.exporter.engine import causes
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.events import as_event


def _job(fault: Callable[[Proc, Proc, Proc], None], detected: bool = True) -> Pod:
    """Steps of 1 s from 1.0; a save at step 1; ``fault`` at 3.0 s (rank 1 in its step 2: 3.0 − 2.0
    lost); the launcher restarts both at 4.0, they restore step 1 and step on to the end."""
    pod = Pod()
    launcher = pod.launcher(0.0)
    old = [pod.proc(r) for r in (0, 1)]
    for p in old:
        p.start(0.5)
        p.step(0, 1.0, 2.0)
        p.ev("checkpoint_start", 2.0, ckpt="step-000000", step=0, mode="sync")
        p.ev("checkpoint_end", 2.0, ckpt="step-000000", step=0, ok=True, written=2.0, error=None)
        p.step(1, 2.0, 2.5)  # rolled back by the restore: lost
    fault(launcher, old[0], old[1])
    if detected:
        launcher.ev("launcher_failure_detected", 3.2)
    launcher.ev("launcher_worker_exit", 3.4, worker_pid=old[0].pid)  # the launcher stopping rank 0
    launcher.ev("launcher_workers_terminated", 3.5)
    launcher.ev("launcher_worker_start", 4.0)
    new = [pod.proc(r, restart=1) for r in (0, 1)]
    for p in new:
        p.start(4.1)
        p.restore(0, 4.2, 4.5)
        p.step(1, 5.0, 6.0)
        p.end(6.5)
    launcher.ev("launcher_exit", 7.0, code=0)
    return pod


def _caused(pod: Pod) -> tuple[dict[FaultCause, float], FaultCause]:
    engine = Engine(reorder_window_s=0.5)
    for record in pod.records:
        engine.ingest(as_event(record))
    snap = engine.snapshot(10.0, 10.0 + pod.wall_offset)
    assert snap.finished
    (restart,) = snap.restarts.recent
    assert restart.level is RestartLevel.INJOB
    by: dict[FaultCause, float] = {}
    for (_, cause), seconds in snap.caused.items():
        by[cause] = by.get(cause, 0.0) + seconds
    assert sum(by.values()) == pytest.approx(snap.seconds[Category.LOST] + snap.seconds[Category.RESTART])
    # the restart's own: all but the unfinished step a rank's own fault booked before it began
    assert restart.lost_s + restart.restart_s <= sum(by.values()) + 1e-9
    return by, restart.fault


def _exit(**how: int) -> Callable[[Proc, Proc, Proc], None]:
    def fault(launcher: Proc, _: Proc, faulty: Proc) -> None:
        launcher.ev("launcher_worker_exit", 3.0, worker_pid=faulty.pid, **how)
    return fault


@pytest.mark.parametrize("fault, cause", [
    (_exit(signal=int(signal.SIGKILL)), FaultCause.KILLED),
    (_exit(signal=int(signal.SIGSEGV)), FaultCause.KILLED),
    (_exit(exit_code=1), FaultCause.EXCEPTION),
    (_exit(signal=int(signal.SIGTERM)), FaultCause.PREEMPTED),
    (_exit(signal=int(signal.SIGINT)), FaultCause.STOPPED),
    (_exit(), FaultCause.UNKNOWN),  # how it ended was not read: the launcher reaped it first
], ids=["sigkill", "sigsegv", "exit 1", "sigterm", "sigint", "unread"])
def test_a_workers_exit_is_its_faults_cause(fault, cause):
    by, decided = _caused(_job(fault))
    assert decided is cause and set(by) == {cause}


def test_every_lost_and_restart_second_of_a_kill_is_the_kills():
    """Rank 1's unfinished step (2.5 → 3.0), both ranks' rolled-back step 1 (0.5 each), and both
    ranks' restart (from each one's fault to its first step again, restore excluded)."""
    by, cause = _caused(_job(_exit(signal=int(signal.SIGKILL))))
    assert cause is FaultCause.KILLED and set(by) == {FaultCause.KILLED}
    restart = (5.0 - 3.0 - 0.3) + (5.0 - 2.5 - 0.3)  # rank 1 from its exit, rank 0 from its last record
    assert by[FaultCause.KILLED] == pytest.approx(0.5 + 2 * 0.5 + restart)


def test_an_exception_that_left_a_step_is_an_exception_whatever_the_exit():
    def fault(launcher: Proc, _: Proc, faulty: Proc) -> None:
        faulty.ev("step_failed", 3.0, step=2, start=2.5, error="RuntimeError: boom")
        launcher.ev("launcher_worker_exit", 3.1, worker_pid=faulty.pid, exit_code=1)
    assert _caused(_job(fault))[1] is FaultCause.EXCEPTION


# what gloo raised in the demo's surviving pod when its peer's node went (tests/test_demo_pods.py)
_PEER_GONE = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
              "[127.0.0.1]:46485: Connection reset by peer. This is typically caused by a remote worker hanging "
              "or bugs in the application.")


def test_a_collective_that_lost_its_peer_is_the_peers_fault():
    """A surviving pod after its peer pod's node went: its rank's collective failed because the peer
    was gone, and its launcher restarted both. Its ranks were healthy: every second is ``peer_fault``."""
    def fault(launcher: Proc, _: Proc, faulty: Proc) -> None:
        faulty.ev("step_failed", 3.0, step=2, start=2.5, error=_PEER_GONE)
        launcher.ev("launcher_worker_exit", 3.1, worker_pid=faulty.pid, exit_code=1)
    by, cause = _caused(_job(fault))
    assert cause is FaultCause.PEER_FAULT and set(by) == {FaultCause.PEER_FAULT}


def test_a_ranks_own_fault_outranks_a_peers_broken_collective_dated_first():
    """Rank 1 is killed; rank 0's collective fails on the closed socket and journals it before the
    launcher's exit timer dates the kill. The restart is the kill's, and so is every second: rank 0's
    unfinished step too, which the kill failed."""
    def fault(launcher: Proc, survivor: Proc, faulty: Proc) -> None:
        survivor.ev("step_failed", 2.95, step=2, start=2.5, error=_PEER_GONE)
        launcher.ev("launcher_worker_exit", 3.0, worker_pid=faulty.pid, signal=int(signal.SIGKILL))
    by, cause = _caused(_job(fault))
    assert cause is FaultCause.KILLED and set(by) == {FaultCause.KILLED}


def test_the_launcher_told_to_stop_makes_its_workers_ends_preempted_whatever_it_sent_them():
    """The kubelet's SIGTERM to the launcher, which then kills its worker: the stop's, not a kill."""
    def fault(launcher: Proc, _: Proc, faulty: Proc) -> None:
        launcher.ev("launcher_signal", 2.9, signal=int(signal.SIGTERM))
        launcher.ev("launcher_worker_exit", 3.0, worker_pid=faulty.pid, signal=int(signal.SIGKILL))
    by, cause = _caused(_job(fault))
    assert cause is FaultCause.PREEMPTED and set(by) == {FaultCause.PREEMPTED}


def test_workers_found_unhealthy_with_none_gone_are_a_hang():
    """No worker exited or raised before the launcher detected the failure (a heartbeat timeout):
    the launcher stops both."""
    def fault(launcher: Proc, _: Proc, faulty: Proc) -> None:
        launcher.ev("launcher_failure_detected", 3.0)
        launcher.ev("launcher_worker_exit", 3.3, worker_pid=faulty.pid, signal=int(signal.SIGTERM))
    assert _caused(_job(fault, detected=False))[1] is FaultCause.HANG


def test_the_wrappers_timeout_is_a_hang_and_its_exception_an_exception():
    """An in-process restart: the Wrapper's interruption records name each rank's interruption."""
    for interruption, cause in (("SOFT_TIMEOUT", FaultCause.HANG), ("EXCEPTION", FaultCause.EXCEPTION)):
        pod = Pod()
        procs = [pod.proc(r) for r in (0, 1)]
        for p in procs:
            p.start(0.5)
            p.step(0, 1.0, 2.0)
        for p in procs:
            p.ev("inprocess_abort", 3.0)
            p.ev("inprocess_finalize", 3.2, cause=None)
            p.ev("inprocess_rank_assignment", 3.4, cause=f"rank 1: {interruption}")
            p.iter = 1
            p.ev("inprocess_initialize", 3.6)
            p.step(1, 4.0, 5.0)
        engine = Engine(reorder_window_s=0.0)
        for record in pod.records:
            engine.ingest(as_event(record))
        (restart,) = engine.snapshot(10.0, 10.0 + pod.wall_offset).restarts.recent
        assert (restart.level, restart.fault) == (RestartLevel.INPROCESS, cause)


def test_the_signals_and_codes_map_onto_the_vocabulary():
    assert causes.of_exit(int(signal.SIGKILL), None) is FaultCause.KILLED
    assert causes.of_exit(int(signal.SIGHUP), None) is FaultCause.STOPPED
    assert causes.of_exit(None, 137) is FaultCause.EXCEPTION
    assert causes.of_exit(None, 0) is FaultCause.UNKNOWN
    assert causes.of_interruption("rank 0: EXCEPTION; rank 1: HARD_TIMEOUT") is FaultCause.HANG
    assert causes.of_interruption("InjectedFault: injected exception at step 45") is FaultCause.EXCEPTION
    assert causes.of_error("RuntimeError: boom") is FaultCause.EXCEPTION
    assert causes.of_error(_PEER_GONE) is FaultCause.PEER_FAULT
    assert causes.of_error("torch.distributed.DistNetworkError: Connection closed by peer") is FaultCause.PEER_FAULT


def test_a_rank_read_after_its_restart_folded_is_charged_as_if_read_in_order():
    """Rank 0's records are read only after rank 1's and the launcher's (its file read late), the
    launcher's exit last: the in-job restart folds with rank 1 alone, as nothing read said rank 0
    would join, so rank 0 joins none. Its restart seconds and the step its restore rolled back are
    still the kill's, split at the restart's fault instant: the same seconds and causes as read in order."""
    pod = _job(_exit(signal=int(signal.SIGKILL)))
    late = [r for r in pod.records if r["rank"] == 0]
    last = [r for r in pod.records if r["type"] == "launcher_exit"]
    snaps = []
    for records in (pod.records, [r for r in pod.records if r not in late + last] + late + last):
        engine = Engine(reorder_window_s=0.0)  # each rank's records in order: none is held back
        for record in records:
            engine.ingest(as_event(record))
        snaps.append(engine.snapshot(10.0, 10.0 + pod.wall_offset))
    in_order, read_late = snaps
    assert read_late.finished and read_late.late == 0
    assert [r.ranks for r in in_order.restarts.recent] == [2] and [r.ranks for r in read_late.restarts.recent] == [1]
    restart = (5.0 - 3.0 - 0.3) + (5.0 - 2.5 - 0.3)  # rank 1 from its exit, rank 0 from its last record
    lost = 0.5 + 2 * 0.5  # rank 1's unfinished step, both ranks' rolled-back step 1
    for snap in snaps:
        assert snap.caused == pytest.approx({(Category.RESTART, FaultCause.KILLED): restart,
                                             (Category.LOST, FaultCause.KILLED): lost})
        assert snap.seconds[Category.RESTART] == pytest.approx(restart)
        assert snap.seconds[Category.LOST] == pytest.approx(lost)
