"""The reference job's journal, read back from one real demo run (2 gloo ranks, real NVRx, real
ft_launcher and inprocess.Wrapper, one SIGKILL and one exception): every line valid, checkpoints,
both restart levels and the resume points in the order the schema promises."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from journal_truth import read_journal
from nvrx_slo.contracts import schema
from nvrx_slo.trainer.reference.checkpoint import METADATA
from nvrx_slo.trainer.reference.harness import DEFAULT_FAULTS

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.nvrx]
CRASH, EXCEPTION = DEFAULT_FAULTS


@pytest.fixture(scope="module")
def records(demo_run):
    assert demo_run.returncode == 0, Path(demo_run.log_path).read_text()[-3000:]
    return read_journal(demo_run.journal_dir)


def _of(records, *types, **match):
    return [r for r in records if r["type"] in types and all(r.get(k) == v for k, v in match.items())]


def test_every_line_is_valid_and_each_process_numbers_its_records_from_zero(demo_run, records):
    lines = [line for path in Path(demo_run.journal_dir).iterdir() for line in path.read_bytes().splitlines()]
    assert len(lines) == len(records)  # read_journal skipped nothing
    by_pid = defaultdict(list)
    for path in Path(demo_run.journal_dir).iterdir():
        for line in path.read_bytes().splitlines():
            r = schema.decode(line)
            by_pid[r["pid"]].append(r["seq"])
    assert all(seqs == list(range(len(seqs))) for seqs in by_pid.values())
    assert {r["job"] for r in records} == {"demo"}
    launchers = {r["pid"] for r in records if r["rank"] is None}
    assert len(launchers) == 1 and len(by_pid) == 1 + 2 * 2  # launcher + 2 ranks x 2 incarnations


def test_each_checkpoint_is_start_scheduled_end_with_a_background_write_stamped_by_the_writer(records):
    spans = defaultdict(list)
    for r in _of(records, "checkpoint_start", "checkpoint_scheduled", "checkpoint_finalize", "checkpoint_end"):
        spans[(r["pid"], r["iter"], r["ckpt"])].append(r)
    completed = [s for s in spans.values() if s[-1]["type"] == "checkpoint_end" and s[-1]["ok"]]
    assert len(completed) >= 2 * 4  # both ranks, at least steps 9, 19, 39 and one more
    for span in completed:
        # the loop's polls of the writer are on the end (waited_s), not records of their own
        start, scheduled, end = span
        assert [r["type"] for r in span] == ["checkpoint_start", "checkpoint_scheduled", "checkpoint_end"]
        assert start["mode"] == "async" and start["step"] == end["step"] == int(start["ckpt"].split("-")[1])
        assert 0 < scheduled["plan_s"] + scheduled["stage_s"] <= scheduled["mono"] - start["mono"] + 1e-5
        assert scheduled["bytes"] > 1_000_000  # this rank's half of ~8 MB of model + optimizer state
        assert scheduled["mono"] < end["written"] <= end["mono"]  # stamped when the write finished
        assert 0 < end["waited_s"] < end["mono"] - scheduled["mono"]  # at least the poll that finalized it
    # every wait is carried by the next record the loop wrote, and adds up to the saves' shares in
    # each process that ended every save it started; one killed with a save in flight (the crash at
    # step 24 can come before step 19's save finalized) carried waits that save never journaled
    carried, shares, unended = defaultdict(float), defaultdict(float), defaultdict(set)
    for r in records:
        if r["rank"] is not None:
            carried[r["pid"]] += r.get("blocked_s", 0.0)
    for (pid, _, ckpt), span in spans.items():
        shares[pid] += span[-1].get("waited_s", 0.0)
        if span[-1]["type"] != "checkpoint_end":
            unended[pid].add(ckpt)
    whole = [pid for pid in carried if not unended[pid]]
    assert len(whole) >= 2  # at least the restarted incarnation of each rank, which ran to the end
    for pid in carried:
        if pid in whole:
            assert carried[pid] == pytest.approx(shares[pid], rel=0.01, abs=1e-5), pid
        else:
            assert carried[pid] >= shares[pid] - 1e-5, pid
    # a checkpoint is complete on disk exactly when every rank journaled it ok
    ok_steps = {s[-1]["step"] for s in completed}
    assert ok_steps >= {9, 19, 29, 39, 49}


def test_a_process_that_exits_cleanly_ends_every_save_it_started(records):
    clean = {r["pid"] for r in _of(records, "process_end")}
    starts = {(r["pid"], r["iter"], r["ckpt"]) for r in _of(records, "checkpoint_start") if r["pid"] in clean}
    ends = {(r["pid"], r["iter"], r["ckpt"]) for r in _of(records, "checkpoint_end") if r["pid"] in clean}
    assert starts == ends
    workers = _of(records, "checkpoint_worker")
    assert all(any(w["alive"] and w["pid"] == pid for w in workers) for pid in clean)
    assert all(any(not w["alive"] and w["pid"] == pid for w in workers) for pid in clean)


def test_the_crash_is_an_in_job_restart_the_launcher_journals_phase_by_phase(records):
    (fault,) = _of(records, "fault_injected", kind="crash")
    assert fault["step"] == CRASH.step and fault["restart"] == 0
    crashed = _of(records, "process_start", rank=fault["rank"], restart=0)[0]["pid"]
    exits = [r for r in records if r["type"] == "launcher_worker_exit" and r["mono"] >= fault["mono"]]
    assert exits[0]["worker_pid"] == crashed  # the kill's instant, from the kernel, before the detection
    launcher = [r for r in records if r["rank"] is None and r["mono"] >= fault["mono"]
                and r["type"] not in ("launcher_metric", "launcher_worker_exit")]
    assert exits[0]["mono"] < launcher[0]["mono"]
    assert [r["type"] for r in launcher[:5]] == [
        "launcher_failure_detected", "launcher_workers_terminated", "launcher_rendezvous_start",
        "launcher_rendezvous_done", "launcher_worker_start"]
    assert launcher[0]["restart"] == 0 and all(r["restart"] == 1 for r in launcher[1:5])
    assert launcher[0]["mono"] - fault["mono"] < 5  # detection
    new = _of(records, "process_start", restart=1)
    assert len(new) == 2 and all(r["mono"] > launcher[4]["mono"] for r in new)
    assert all(r["local_world_size"] == 2 for r in _of(records, "process_start"))  # from ft_launcher's env
    assert _of(records, "launcher_exit")[0]["code"] == 0


def test_the_exception_is_an_in_process_restart_through_every_wrapper_callback(records):
    (fault,) = _of(records, "fault_injected", kind="exception")
    assert fault["step"] == EXCEPTION.step and fault["iter"] == 0
    for rank in (0, 1):
        mine = [r for r in records
                if r["rank"] == rank and r["mono"] >= fault["mono"] and r["type"].startswith("inprocess_")]
        assert [r["type"] for r in mine[:4]] == ["inprocess_abort", "inprocess_finalize", "inprocess_rank_assignment",
                                                 "inprocess_initialize"]
        assert [r["iter"] for r in mine[:4]] == [0, 0, 0, 1]
        assert "EXCEPTION" in mine[2]["cause"]
        assert mine[-1]["type"] == "inprocess_completion"
    cause = next(r["cause"] for r in _of(records, "inprocess_finalize",
                                         rank=fault["rank"]) if r["mono"] > fault["mono"])
    assert cause.startswith("InjectedFault")
    assert {r["pid"] for r in _of(records, "step", iter=1)} == {r["pid"] for r in _of(records, "step", iter=0,
                                                                                        restart=fault["restart"])}


def test_every_restart_resumes_from_the_newest_checkpoint_complete_before_the_fault(records, demo_run):
    ends = _of(records, "checkpoint_end", ok=True)

    def newest_complete(before: float, at: str) -> int | None:
        """The newest save both ranks had ended (``mono``: journaled; ``written``: on disk) before then."""
        done = [r["step"] for r in ends if r[at] < before]
        return max((s for s in done if done.count(s) == 2), default=None)

    for fault in _of(records, "fault_injected"):
        restores = [r for r in _of(records, "restore") if r["mono"] > fault["mono"]][:2]
        # at least the newest journaled complete before the fault; at most the newest on disk when the
        # restore began (a save in flight at an in-process fault may still land during the restart)
        lowest, highest = newest_complete(fault["mono"], "mono"), newest_complete(restores[0]["start"], "written")
        restored = restores[0]["step"]
        assert restores[1]["step"] == restored, fault
        assert (lowest or -1) <= (restored if restored is not None else -1) <= (highest or -1), (fault, restores)
        assert all(r["fallback"] is None for r in restores)
        for restore in restores:
            first = next(r for r in _of(records, "step", pid=restore["pid"], iter=restore["iter"])
                         if r["mono"] > restore["mono"])
            assert first["step"] == (0 if restored is None else restored + 1)
    assert (Path(demo_run.checkpoint_dir) / "step-000049" / METADATA).is_file()
