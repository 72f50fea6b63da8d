"""Hand-built pod journals, one per story a test tells the exporter. Times are journal mono seconds.

Each function returns the ``Pod`` (its ``records`` in write order), or its records; the tests state
what the engine, the sidecar or a report must make of it. ``journal_fixtures`` writes them to disk.
"""

from __future__ import annotations

from journal_builder import Pod, Proc

EVIL = '"><script>alert(1)</script><img src=x onerror=alert(2)>'  # in every string a page shows


def _steps(procs: list[Proc], first: int, last: int, t: float, length: float = 1.0, data_s: float = 0.0) -> float:
    for step in range(first, last + 1):
        for p in procs:
            p.step(step, t, t + length, data_s=data_s)
        t += length
    return t


def healthy() -> Pod:
    """Launcher at 0, two ranks up at 1, steps 1-10 of 1 s from 3 (0.1 s data each), an async save
    of step 5 blocking 0.2 s and durable at 9.0 (observed mid step 7), clean exit at 14.2."""
    pod = Pod()
    launcher = pod.launcher(0.0)
    ranks = [pod.proc(r) for r in range(2)]
    for p in ranks:
        p.start(1.0)
        p.ev("checkpoint_worker", 1.5, alive=True, worker_pid=999)
    t = _steps(ranks, 1, 5, 3.0, data_s=0.1)
    for p in ranks:
        p.save(5, t, t + 0.2, written=t + 1.0, observed=t + 1.5)
    t = _steps(ranks, 6, 6, t + 0.2, data_s=0.1)
    for p in ranks:
        p.save_end()  # observed at 9.5, in the middle of step 7: a point event never cuts a step
    t = _steps(ranks, 7, 10, t, data_s=0.1)
    for p in ranks:
        p.end(t + 0.5)
    launcher.ev("launcher_exit", t + 1.0, code=0)
    return pod


def crash_with_rollback() -> Pod:
    """Steps 1-3, a save of step 3 (durable), steps 4-6, a crash injected on rank 0 at 8.3; ft_launcher
    detects it at 8.7, tears down at 9.0, re-rendezvous by 9.5; new processes (restart=1) start at
    10.0 / 10.2, restore step 3 over [10.5, 11.0], first steps start at 11.2 / 11.3; steps 4-7, a save
    of step 7, clean exit."""
    pod = Pod()
    launcher = pod.launcher(0.0)
    old = [pod.proc(r) for r in range(2)]
    for p in old:
        p.start(1.0)
    t = _steps(old, 1, 3, 2.0)  # -> 5.0
    for p in old:
        p.save(3, t, t + 0.1, written=t + 0.6, observed=t + 1.15)
    t = _steps(old, 4, 4, t + 0.1)  # -> 6.1
    for p in old:
        p.save_end()  # observed at 6.15
    t = _steps(old, 5, 6, t)  # -> 8.1
    old[0].ev("fault_injected", 8.3, kind="crash", step=7)
    for kind, mono in (("launcher_failure_detected", 8.7), ("launcher_workers_terminated", 9.0),
                       ("launcher_rendezvous_start", 9.1), ("launcher_rendezvous_done", 9.5),
                       ("launcher_worker_start", 9.6)):
        launcher.ev(kind, mono)
    new = [pod.proc(r, restart=1) for r in range(2)]
    new[0].start(10.0)
    new[1].start(10.2)
    for p in new:
        p.restore(3, 10.5, 11.0)
    new[0].step(4, 11.2, 12.3)
    new[1].step(4, 11.3, 12.3)
    t = _steps(new, 5, 7, 12.3)  # -> 15.3
    for p in new:
        p.save(7, t, t + 0.1, written=t + 0.5, observed=t + 0.6)
        p.save_end()
        p.end(t + 1.0)
    launcher.ev("launcher_exit", t + 1.5, code=0)
    return pod


def inprocess_restart() -> Pod:
    """One process per rank under inprocess.Wrapper: steps 1-4, a durable save of step 2, an exception
    injected on rank 0 at 7.2; Wrapper callbacks abort 8.2/8.25, finalize 8.5/8.6, rank assignment
    9.0/9.1, initialize (iter 1) 9.3/9.35; restore step 2 over [9.4, 9.8]; steps 3-5 from 10.0; exit."""
    pod = Pod()
    launcher = pod.launcher(0.0)
    ranks = [pod.proc(r) for r in range(2)]
    for p in ranks:
        p.start(0.5)
        p.ev("inprocess_initialize", 0.6)
    t = _steps(ranks, 1, 2, 1.0)  # -> 3.0
    for p in ranks:
        p.save(2, t, t + 0.1, written=t + 0.5, observed=t + 0.5)
        p.save_end()
    t = _steps(ranks, 3, 4, t + 0.1)  # -> 5.1
    ranks[0].ev("fault_injected", 7.2, kind="exception", step=5)
    for p, d in zip(ranks, (0.0, 0.05), strict=True):
        p.ev("inprocess_abort", 8.2 + d)
    for p, d in zip(ranks, (0.0, 0.1), strict=True):
        p.ev("inprocess_finalize", 8.5 + d, cause="RuntimeError: injected")
        p.ev("inprocess_rank_assignment", 9.0 + d, cause="rank 0: EXCEPTION")
    for p, d in zip(ranks, (0.0, 0.05), strict=True):
        p.iter = 1
        p.ev("inprocess_initialize", 9.3 + d)
        p.restore(2, 9.4, 9.8)
    t = _steps(ranks, 3, 5, 10.0)  # -> 13.0
    for p in ranks:
        p.ev("inprocess_completion", t + 0.1)
        p.end(t + 0.2)
    launcher.ev("launcher_exit", t + 0.5, code=0)
    return pod


def failed_save() -> Pod:
    """Steps 1-3 from 1.0, a save of step 3 that fails (the ranks agree on the outcome), steps 4-5
    until 6.1; still running."""
    pod = Pod()
    ranks = [pod.proc(r) for r in range(2)]
    for p in ranks:
        p.start(0.0)
    t = _steps(ranks, 1, 3, 1.0)
    for p in ranks:
        p.save(3, t, t + 0.1, written=t + 0.4, observed=t + 0.5, ok=False)
        p.save_end()
    _steps(ranks, 4, 5, t + 0.1)
    return pod


def pod_restart() -> Pod:
    """A launcher and two ranks train steps 1-2 with a durable save of step 2; the container is killed
    (no launcher_exit, no fault journaled); a new launcher starts at 20, rendezvous done at 21, ranks
    (restart 0 again) start at 22, restore step 2 over [22.5, 23], step 3 from 23.5."""
    pod = Pod()
    pod.launcher(0.0)
    old = [pod.proc(r) for r in range(2)]
    for p in old:
        p.start(1.0)
    t = _steps(old, 1, 2, 2.0)
    for p in old:
        p.save(2, t, t + 0.1, written=t + 0.3, observed=t + 0.4)
        p.save_end()
    _steps(old, 3, 3, t + 0.1)  # step 3 ends at 5.1, then the pod dies
    launcher = pod.launcher(20.0)
    launcher.ev("launcher_rendezvous_done", 21.0)
    new = [pod.proc(r) for r in range(2)]
    for p in new:
        p.start(22.0)
        p.restore(2, 22.5, 23.0)
    _steps(new, 3, 4, 23.5)
    return pod


def killed_from_outside(raised: bool = False, marked: bool = False) -> Pod:
    """Steps 1-3 of 1 s from 2.0 on two ranks, no save; rank 0's loop stops 0.6 s into step 4 at 5.6 —
    killed from outside (the launcher journals its worker's exit) or, with ``raised``, an exception
    leaving the step (``step_failed``); with ``marked``, the loop journaled ``fault_injected`` (the
    kill or the exception it was about to cause) at 5.55. ft_launcher detects it at 6.0 and stops rank 1, whose exit
    (6.3) is teardown, not a fault; new processes restore nothing (fresh start), step from 8.0 / 8.1
    and exit at 9.5."""
    pod = Pod()
    launcher = pod.launcher(0.0)
    old = [pod.proc(r) for r in range(2)]
    for p in old:
        p.start(1.0)
    _steps(old, 1, 3, 2.0)  # -> 5.0
    if marked:
        old[0].ev("fault_injected", 5.55, kind="exception" if raised else "crash", step=4)
    if raised:
        old[0].ev("step_failed", 5.6, step=4, start=5.0, error="RuntimeError: boom")
    launcher.ev("launcher_worker_exit", 5.6 if not raised else 5.65, worker_pid=old[0].pid)
    launcher.ev("launcher_failure_detected", 6.0)
    launcher.ev("launcher_worker_exit", 6.3, worker_pid=old[1].pid)
    for kind, mono in (("launcher_workers_terminated", 6.4), ("launcher_rendezvous_done", 6.8),
                       ("launcher_worker_start", 7.0)):
        launcher.ev(kind, mono)
    new = [pod.proc(r, restart=1) for r in range(2)]
    for p in new:
        p.start(7.2)
        p.restore(None, 7.5, 7.6)
    new[0].step(1, 8.0, 9.0)
    new[1].step(1, 8.1, 9.0)
    for p in new:
        p.end(9.5)
    launcher.ev("launcher_exit", 10.0, code=0)
    return pod


def survivor_of_another_pods_fault() -> Pod:
    """One pod of a two-pod job (rank 0 here) whose peer pod's worker died: steps 1-3 of 1 s from
    2.0, then rank 0's step 4 fails at 5.4 (its collective lost the peer). Its own launcher saw no
    failure: it stops its worker for the new rendezvous round (exit 5.8, terminated 5.9) and starts
    it again (7.0) with the restart count unchanged; the new process restores nothing and steps
    from 8.0, exiting at 9.5."""
    pod = Pod()
    launcher = pod.launcher(0.0)
    old = pod.proc(0)
    old.start(1.0, world_size=2, local_world_size=1)
    _steps([old], 1, 3, 2.0)  # -> 5.0
    old.ev("step_failed", 5.4, step=4, start=5.0, error="DistBackendError: peer gone")
    launcher.ev("launcher_worker_exit", 5.8, worker_pid=old.pid)
    for kind, mono in (("launcher_workers_terminated", 5.9), ("launcher_rendezvous_start", 6.0),
                       ("launcher_rendezvous_done", 6.8), ("launcher_worker_start", 7.0)):
        launcher.ev(kind, mono)
    new = pod.proc(0)
    new.start(7.2, world_size=2, local_world_size=1)
    new.restore(None, 7.5, 7.6)
    new.step(1, 8.0, 9.0)
    new.end(9.5)
    launcher.ev("launcher_exit", 10.0, code=0)
    return pod


def peer_waits_in_a_collective() -> Pod:
    """Plain torchrun (no launcher of ours journals), two ranks, steps of 1 s from 2.0 and a sync save
    of step 3 over [5.0, 5.1]. Rank 1 raises 0.5 s into step 4 (5.6), after the step's collectives,
    and its interpreter exits at 7.0; rank 0 finishes step 4 at 6.1 and waits in step 5's collective
    until it fails at 7.3, when its peer's sockets close, and exits at 7.4. torchrun starts the round
    again (restart 1): the processes start at 8.0, restore step 3 over [8.2, 8.5], step 4 from 9.0,
    save it and end at 10.5. The loop's own clock: each rank did 0.5 s of work after the save before
    the fault (5.1 → 5.6), and the rest it did until the restart is the restart's."""
    pod = Pod()
    old = [pod.proc(r) for r in range(2)]
    for p in old:
        p.ev("process_start", 1.0, world_size=2, local_world_size=2, max_restarts=1)
    _steps(old, 1, 3, 2.0)  # -> 5.0
    for p in old:
        p.save(3, 5.0, 5.1, written=5.1, observed=5.1, mode="sync")
        p.save_end()
    old[1].ev("step_failed", 5.6, step=4, start=5.1, error="RuntimeError: planted at step 4")
    old[0].step(4, 5.1, 6.1)
    old[1].ev("process_end", 7.0, error="RuntimeError: planted at step 4")
    old[0].ev("step_failed", 7.3, step=5, start=6.1, error="DistBackendError: connection closed by peer")
    old[0].ev("process_end", 7.4, error="DistBackendError: connection closed by peer")
    new = [pod.proc(r, restart=1) for r in range(2)]
    for p in new:
        p.ev("process_start", 8.0, world_size=2, local_world_size=2, max_restarts=1)
        p.restore(3, 8.2, 8.5)
        p.step(4, 9.0, 10.0)
        p.save(4, 10.0, 10.1, written=10.1, observed=10.1, mode="sync")
        p.save_end()
        p.end(10.5)
    return pod


def inprocess_job(ranks: int = 2, steps: int = 60, ckpt_every: int = 20, fault_after: int = 50,
          dt: float = 0.1, world_size: int = 2, eval_s: float = 0.0) -> Pod:
    """Each rank trains ``steps`` steps, saving every ``ckpt_every``; after step ``fault_after``
    an exception triggers an in-process restart that resumes from the last save; with ``eval_s``,
    each rank evaluates that long after its last step (a user span). One launcher."""
    pod = Pod()
    t0 = 1000.0
    launcher = pod.launcher(t0 - 1.0)
    end_times = []
    for rank in range(ranks):
        p = pod.proc(rank)
        p.start(t0, world_size=world_size)
        p.restore(None, t0 + 0.2, t0 + 0.5)
        t, n, saved, faulted = t0 + 0.5, 1, 0, False
        pending = None  # (observed, proc) of a save whose end is still to be written
        while n <= steps:
            p.step(n, t, t + dt * 0.9, data_s=0.005)
            t += dt
            if pending is not None and pending <= t:
                p.save_end()
                pending = None
            if n % ckpt_every == 0:
                p.save(n, t, t + 0.02, t + 0.3, t + 0.31)
                pending, saved, t = t + 0.31, n, t + 0.02
            if n == fault_after and not faulted:
                if pending is not None:  # the write lands before the fault
                    t = max(t, pending)
                    p.save_end()
                    pending = None
                faulted = True
                p.ev("inprocess_abort", t + 0.2)
                p.ev("inprocess_finalize", t + 0.6, cause=f"RuntimeError: injected {EVIL}")
                p.ev("inprocess_rank_assignment", t + 0.8, cause=f"RuntimeError: injected {EVIL}")
                p.iter = 1
                p.ev("inprocess_initialize", t + 1.0)
                p.restore(saved, t + 1.05, t + 1.3)
                t, n = t + 1.3, saved
            n += 1
        if pending is not None:
            p.save_end()
            t = max(t, pending)
        if eval_s:
            p.ev("user_span", t + eval_s, name="eval", start=t)
            t += eval_s
        p.end(t + 0.1)
        end_times.append(t + 0.1)
    launcher.ev("launcher_exit", max(end_times) + 0.2, code=0)
    return pod


def crash_and_restart_records() -> list[dict]:
    """Two ranks: steps, an async save, a crash, an in-job restart from the save, a clean end."""
    pod = Pod()
    launcher = pod.launcher(0.0)
    launcher.ev("launcher_worker_start", 0.1)
    procs = [pod.proc(r) for r in (0, 1)]
    for p in procs:
        p.start(1.0)
        p.restore(None, 1.1, 1.5)
    t = 1.5
    for step in range(1, 31):
        for p in procs:
            p.step(step, t, t + 0.5, data_s=0.05)
        t += 0.5
        if step == 20:
            for p in procs:
                p.save(step, t, t + 0.05, t + 1.0, t + 1.2)
            t += 0.05
        if step == 23:
            for p in procs:
                p.save_end()
    for p in procs:
        p.ev("fault_injected", t + 0.1, kind="crash", step=30)
    launcher.ev("launcher_failure_detected", t + 0.6)
    launcher.ev("launcher_workers_terminated", t + 0.9)
    launcher.ev("launcher_rendezvous_start", t + 1.0)
    launcher.ev("launcher_rendezvous_done", t + 1.5)
    launcher.ev("launcher_worker_start", t + 1.6)
    procs = [pod.proc(r, restart=1) for r in (0, 1)]
    t += 2.0
    for p in procs:
        p.start(t)
        p.restore(20, t + 0.1, t + 0.6)
    t += 0.6
    for step in range(21, 41):
        for p in procs:
            p.step(step, t, t + 0.5)
        t += 0.5
    for p in procs:
        p.end(t + 0.1)
    launcher.ev("launcher_exit", t + 0.5, code=0)
    return pod.records
