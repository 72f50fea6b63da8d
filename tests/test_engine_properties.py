"""Property tests: random pod journals (steps, saves that land or fail, crashes with rollback, an
exception in one rank with its peers failing after it, in-process and pod restarts, stalls, a clean
finish or none) fed to the engine in many orders."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from enum import Enum
from itertools import pairwise
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from journal_builder import Pod, Proc
from nvrx_slo.contracts.catalogue import Category, RestartLevel
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.engine.snapshot import Snapshot
from nvrx_slo.exporter.events import as_event

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ACTIONS = ("steps", "steps", "steps", "save", "save_fails", "crash", "inprocess", "pod", "stall")


@st.composite
def journals(draw: Any) -> Pod:
    """A random but well-formed pod journal, in write order."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    pod = Pod()
    n = draw(st.integers(1, 3))
    launcher = pod.launcher(0.0) if draw(st.booleans()) else None
    t = 0.5
    procs: list[Proc] = []
    restart = 0
    durable: int | None = None
    step = 0
    saved: set[tuple[int, int, int]] = set()

    def jitter() -> float:
        return rng.uniform(0.0, 0.05)

    def start_processes(restore_from: int | None, restore: bool) -> None:
        nonlocal procs, t, step
        procs = [pod.proc(r, restart=restart) for r in range(n)]
        for p in procs:
            p.start(t + jitter(), world_size=n, local_world_size=n)
        t += 0.2
        if restore:
            for p in procs:
                p.restore(restore_from, t + jitter(), t + 0.3)
            step = restore_from or 0
        t += 0.4

    def fail_with_peers_after(at: float) -> None:
        """An exception leaves rank 0's next step; its peers finish that step or not, then their
        collectives fail a little later (the fault's wake: restart time, not lost work)."""
        procs[0].ev("step_failed", at + 0.05, step=step + 1, start=at, error="RuntimeError: boom")
        for p in procs[1:]:
            begun = at
            if rng.random() < 0.5:
                p.step(step + 1, at, at + 0.08)
                begun = at + 0.08
            p.ev("step_failed", at + 0.1 + jitter(), step=step + 2, start=begun, error="DistBackendError: peer gone")

    start_processes(None, restore=False)
    for action in draw(st.lists(st.sampled_from(ACTIONS), max_size=8)):
        if action == "steps":
            for _ in range(draw(st.integers(1, 3))):
                step += 1
                length = rng.choice((0.2, 0.5, 1.0))
                for p in procs:
                    p.step(step, t + jitter(), t + length, data_s=rng.uniform(0.0, length / 2))
                t += length
        elif action in ("save", "save_fails") and (step, restart, procs[0].iter) not in saved:
            saved.add((step, restart, procs[0].iter))  # a trainer saves one id once per process iteration
            ok = action == "save"
            for p in procs:
                p.save(step, t, t + 0.1, written=t + 0.3, observed=t + 0.35, ok=ok)
            t += 0.1
            for p in procs:  # observed while the next steps run
                p.save_end()
            durable = step if ok else durable
            t += 0.3
        elif action == "stall":
            t += rng.uniform(0.5, 3.0)
        elif action == "crash":
            if rng.random() < 0.5:
                procs[0].ev("fault_injected", t + 0.05, kind="crash", step=step + 1)
            if rng.random() < 0.5:
                fail_with_peers_after(t)
            t += 0.3
            if launcher is not None:
                launcher.ev("launcher_failure_detected", t)
                launcher.ev("launcher_workers_terminated", t + 0.1)
                launcher.ev("launcher_rendezvous_done", t + 0.2)
            t += 0.3
            restart += 1
            start_processes(durable, restore=True)
        elif action == "inprocess":
            if rng.random() < 0.5:
                fail_with_peers_after(t)
            t += 0.2
            for p in procs:
                p.ev("inprocess_abort", t + jitter())
                p.ev("inprocess_finalize", t + 0.1 + jitter(), cause="RuntimeError: boom")
                p.ev("inprocess_rank_assignment", t + 0.2 + jitter(), cause=None)
                p.iter += 1
                p.ev("inprocess_initialize", t + 0.3 + jitter())
            t += 0.4
            for p in procs:
                p.restore(durable, t, t + 0.2)
            step = durable or 0
            t += 0.3
        elif action == "pod":
            t += 5.0  # longer than any window used here, as pod restarts are
            saved.clear()
            restart = 0
            if launcher is not None:
                launcher = pod.launcher(t)
            t += 0.2
            start_processes(durable, restore=True)
    if draw(st.booleans()):
        for p in procs:
            p.end(t + jitter())
        if launcher is not None:
            launcher.ev("launcher_exit", t + 0.1, code=0)
    return pod


def span(pod: Pod) -> float:
    return max(r["mono"] for r in pod.records) + 1.0


def feed(records: list[dict[str, Any]], window: float, now: float, engine: Engine | None = None) -> Snapshot:
    engine = engine or Engine(reorder_window_s=window)
    for record in records:
        engine.ingest(as_event(record))
    return engine.snapshot(now, now)


def assert_close(a: Any, b: Any, path: str = "snapshot") -> None:
    """Equal, floats within 1e-9 (sums of the same numbers in another order)."""
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9), f"{path}: {a} != {b}"
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        assert type(a) is type(b), path
        for f in dataclasses.fields(a):
            assert_close(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_close(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)) and not isinstance(a, Enum):
        assert len(a) == len(b), f"{path}: {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def accounted(snap: Snapshot) -> dict[str, Any]:
    """What the final snapshot says about the journal (not about arrival: counts of late etc.)."""
    return {"ranks": snap.ranks, "restarts": snap.restarts, "checkpoints": snap.checkpoints,
            "finished": snap.finished, "efficiency": snap.predicted_efficiency, "caused": snap.caused}


def counters(snap: Snapshot) -> list[tuple[str, float]]:
    """Every value exported as a counter (or histogram bucket), by name."""
    out: list[tuple[str, float]] = []
    for r in snap.ranks:
        out += [(f"r{r.rank}.wall", r.wall_s), (f"r{r.rank}.steps", r.steps), (f"r{r.rank}.idle", r.gpu_idle_s)]
        out += [(f"r{r.rank}.{c.value}", v) for c, v in r.seconds.items()]
        out += [(f"r{r.rank}.step_le{i}", n) for i, n in enumerate(r.step_duration.counts)]
    ck = snap.checkpoints
    out += [("ck.failures", ck.failures), ("ck.saves", ck.saves), ("ck.bytes", ck.bytes_total)]
    out += [(f"ck.blocking_le{i}", n) for i, n in enumerate(ck.blocking.counts)]
    out += [(f"ck.background_le{i}", n) for i, n in enumerate(ck.background.counts)]
    rs = snap.restarts
    out += [(f"restarts.{lv.value}", n) for lv, n in rs.counts.items()]
    out += [(f"restart_s.{lv.value}_le{i}", n) for lv, h in rs.duration.items() for i, n in enumerate(h.counts)]
    out += [(f"phase.{lv.value}.{ph.value}_le{i}", n) for (lv, ph), h in rs.phases.items() for i,
            n in enumerate(h.counts)]
    out += [(f"caused.{category.value}.{cause.value}", v) for (category, cause), v in snap.caused.items()]
    return out


def check_invariant(snap: Snapshot) -> None:
    for r in snap.ranks:
        total = sum(r.seconds.values()) + r.unprotected_s
        assert math.isclose(total, r.wall_s, rel_tol=1e-9, abs_tol=1e-9), (r.rank, total, r.wall_s)
        assert min(r.seconds.values()) >= -1e-9 and r.unprotected_s >= -1e-9, r
    # every lost and restart second has a cause once settled; a restart's once it is over
    faulted = sum(snap.seconds.get(c, 0.0) for c in (Category.LOST, Category.RESTART))
    caused = sum(snap.caused.values())
    assert caused <= faulted + 1e-6, (caused, faulted)
    if snap.finished:
        assert math.isclose(caused, faulted, rel_tol=1e-9, abs_tol=1e-6), (snap.caused, faulted)


def check_monotone(snapshots: list[Snapshot]) -> None:
    for before, after in pairwise(snapshots):
        old = dict(counters(before))
        for name, value in counters(after):
            if name in old:
                assert value >= old[name] - 1e-9, f"{name} went down: {old[name]} -> {value}"


def snapshots_while_feeding(records: list[dict[str, Any]], window: float, every: int,
                            lag: float = 0.0) -> list[Snapshot]:
    """Snapshots taken ``lag`` after the newest record read (> 0: the reader is behind the clock)."""
    engine = Engine(reorder_window_s=window)
    snaps, now = [], 0.0
    for i, record in enumerate(records, 1):
        engine.ingest(as_event(record))
        now = max(now, record["mono"])
        if i % every == 0 or i == len(records):
            snaps.append(engine.snapshot(now + lag, now + lag))
    return snaps


@SETTINGS
@given(pod=journals(), seed=st.integers(0, 2**16), window=st.sampled_from((0.0, 0.5, 2.0)), every=st.integers(1, 7))
def test_counters_never_go_down_and_categories_sum_to_wall_under_any_arrival_order(pod, seed, window, every):
    # A finished job settles its last window at once; that is exact only if no record of a rank
    # arrives after its process_end. With any order, keep the job unfinished.
    records = [r for r in pod.records if r["type"] not in ("process_end", "launcher_exit")]
    random.Random(seed).shuffle(records)
    snaps = snapshots_while_feeding(records, window, every)
    for snap in snaps:
        check_invariant(snap)
    check_monotone(snaps)


@SETTINGS
@given(pod=journals(), seed=st.integers(0, 2**16), window=st.sampled_from((0.0, 0.5, 2.0)), every=st.integers(1, 7),
       lag=st.sampled_from((0.0, 3.0)))
def test_counters_never_go_down_when_each_ranks_records_arrive_in_order(pod, seed, window, every, lag):
    rng = random.Random(seed)
    streams: dict[Any, list[dict[str, Any]]] = {}
    for record in sorted(pod.records, key=lambda r: r["mono"]):
        streams.setdefault(record["rank"], []).append(record)
    records = []
    while streams:  # interleave ranks (and the launcher) at random, each in its own order
        rank = rng.choice(list(streams))
        records.append(streams[rank].pop(0))
        if not streams[rank]:
            del streams[rank]
    snaps = snapshots_while_feeding(records, window, every, lag)  # lag: the finish is read after now passed it
    for snap in snaps:
        check_invariant(snap)
    check_monotone(snaps)


@SETTINGS
@given(pod=journals(), late=st.integers(0, 2), window=st.sampled_from((0.0, 0.5, 2.0)), every=st.integers(1, 7))
def test_a_rank_read_after_all_the_others_leaves_no_second_without_a_cause(pod, late, window, every):
    """One rank's file read last (the launcher's exit after it): its restarts may fold before it
    joins them, and every lost and restart second of it still has a cause once the job finished."""
    records = sorted(pod.records, key=lambda r: r["mono"])
    exits = [r for r in records if r["type"] == "launcher_exit"]
    tail = [r for r in records if r["rank"] == late]
    snaps = snapshots_while_feeding([r for r in records if r not in tail and r not in exits] + tail + exits,
                                    window, every)
    for snap in snaps:
        check_invariant(snap)
    check_monotone(snaps)


@SETTINGS
@given(pod=journals(), seed=st.integers(0, 2**16))
def test_any_order_and_duplicates_give_the_final_snapshot_of_in_order_arrival_when_the_window_covers_it(pod, seed):
    rng = random.Random(seed)
    window, now = span(pod), span(pod) + 5.0
    shuffled = pod.records + rng.sample(pod.records, k=len(pod.records) // 4)
    rng.shuffle(shuffled)
    expected, got = feed(pod.records, window, now), feed(shuffled, window, now)
    assert got.late == 0 and got.duplicates == len(pod.records) // 4
    check_invariant(got)
    assert_close(accounted(got), accounted(expected))


def resaved_after_inprocess_restarts() -> Pod:
    """The example hypothesis found: a save, three in-process restarts, the same id saved again
    (iteration 3). Arriving disordered (seed 0, window 3 s), the second save's scheduled part came
    before its start and was read as a part of the first save, which then never folded."""
    pod = Pod()
    p = pod.proc(0)
    p.start(0.5422210925762524, world_size=1, local_world_size=1)
    p.save(0, 1.1, 1.1 + 0.1, written=1.1 + 0.3, observed=1.1 + 0.35)
    p.save_end()
    for abort, finalize, assign, initialize, restored in (
            (1.7378977201470154, 1.8210285790415426, 1.9129458375146482, 2.02556373606843, 2.1),
            (2.620246706872521, 2.739189929451739, 2.815165636303947, 2.923829847707618, 3.0),
            (3.5291691019727516, 3.6454056442597667, 3.72523434279087, 3.814091892219985, 3.9)):
        p.ev("inprocess_abort", abort)
        p.ev("inprocess_finalize", finalize, cause="RuntimeError: boom")
        p.ev("inprocess_rank_assignment", assign, cause=None)
        p.iter += 1
        p.ev("inprocess_initialize", initialize)
        p.restore(0, restored, restored + 0.2)
    p.save(0, 4.2, 4.3, written=4.5, observed=4.55)
    p.save_end()
    return pod


@SETTINGS
@given(pod=journals(), seed=st.integers(0, 2**16), window=st.sampled_from((0.3, 1.0, 3.0)))
@example(pod=resaved_after_inprocess_restarts(), seed=0, window=3.0)
def test_disorder_within_the_window_gives_the_same_final_snapshot(pod, seed, window):
    rng = random.Random(seed)
    ordered = sorted(pod.records, key=lambda r: (r["mono"], r["pid"], r["seq"]))
    # arrival sorted by mono + delay, delay < window: nothing arrives after a record a window newer
    disordered = sorted(pod.records, key=lambda r: r["mono"] + rng.uniform(0.0, window * 0.999))
    now = span(pod) + 5.0
    expected, got = feed(ordered, window, now), feed(disordered, window, now)
    assert got.late == 0
    assert_close(accounted(got), accounted(expected))


@SETTINGS
@given(pod=journals(), cut=st.floats(0.0, 1.0), window=st.sampled_from((0.0, 1.0)))
def test_state_saved_mid_stream_and_restored_gives_the_uninterrupted_result(pod, cut, window):
    records = sorted(pod.records, key=lambda r: r["mono"])
    at = int(cut * len(records))
    now = span(pod) + 5.0
    expected = feed(records, window, now)
    first = Engine(reorder_window_s=window)
    for record in records[:at]:
        first.ingest(as_event(record))
    resumed = Engine.from_state(json.loads(json.dumps(first.to_state(), allow_nan=False)))
    got = feed(records[max(0, at - 3):], window, now, engine=resumed)  # a few lines read twice
    assert_close(accounted(got), accounted(expected))
    assert got.duplicates == min(3, at)


def flush(pod: Pod, at: float) -> None:
    """A warning from every rank's newest process at ``at``: applies everything a window older."""
    newest: dict[int, dict[str, Any]] = {}
    for record in pod.records:
        if record["rank"] is not None and record["mono"] >= newest.get(record["rank"], {"mono": -1.0})["mono"]:
            newest[record["rank"]] = record
    for rank, record in newest.items():
        Proc(pod, rank, record["pid"], record["restart"], record["iter"], seq=10**6).ev("warning", at, message="flush")


@SETTINGS
@given(pod=journals())
def test_each_restart_is_counted_once_for_the_pod(pod):
    flush(pod, span(pod) + 1.0)
    snap = feed(pod.records, 0.5, span(pod) + 20.0)
    crashes = sum(1 for r in pod.records if r["type"] == "process_start" and r["rank"] == 0) - 1
    inprocess = sum(1 for r in pod.records if r["type"] == "inprocess_initialize" and r["rank"] == 0)
    assert snap.restarts.counts[RestartLevel.INPROCESS] == inprocess
    assert snap.restarts.counts[RestartLevel.INJOB] + snap.restarts.counts[RestartLevel.POD] == crashes
