"""The real sidecar process beside a journal that is being written, scraped over HTTP."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest

from journal_fixtures import write_clean
from needs import tool
from nvrx_slo.contracts.catalogue import Category
from nvrx_slo.contracts.schema import EventType
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.live import Live
from nvrx_slo.exporter.offline.replay import Replay
from nvrx_slo.trainer.journal import Journal, Writer
from sidecar_process import SidecarProcess, counters, value
from stories import crash_and_restart_records


class LiveJob:
    """A 2-rank job journaled by the real writer, in real time: steps, async saves, one in-job
    restart after an injected crash, clean end. Small rotation bound so files rotate under the reader."""

    STEPS = 120
    RESTART_AT = 50

    def __init__(self, directory: Path, step_s: float = 0.02) -> None:
        self.dir = directory
        self.step_s = step_s
        self.fault_mono: float | None = None
        self.first_step_after: list[float] = []
        self.done = threading.Event()
        self.progress = 0
        self.journals: list[Journal] = []

    def _journal(self, rank: int | None, pid: int, restart: int) -> Journal:
        ident = Writer(job="job-live", pod="pod-live", node="node-0", rank=rank, local_rank=rank, pid=pid,
                         restart=restart)
        self.journals.append(Journal(self.dir, ident, max_bytes=6000, keep=3))
        return self.journals[-1]

    def run(self) -> None:
        launcher = self._journal(None, 10, 0)
        launcher.emit(EventType.LAUNCHER_START, max_restarts=3)
        launcher.emit(EventType.LAUNCHER_WORKER_START)
        ranks = [self._start(r, 100 + r, 0, None) for r in (0, 1)]
        last = {r: time.monotonic() for r in (0, 1)}
        for step in range(1, self.STEPS + 1):
            if step == self.RESTART_AT:
                for j in ranks:
                    j.emit(EventType.FAULT_INJECTED, kind="crash", step=step)
                self.fault_mono = time.monotonic()
                time.sleep(0.05)
                launcher.emit(EventType.LAUNCHER_FAILURE_DETECTED)
                launcher.emit(EventType.LAUNCHER_WORKERS_TERMINATED)
                launcher.emit(EventType.LAUNCHER_RENDEZVOUS_START)
                launcher.emit(EventType.LAUNCHER_RENDEZVOUS_DONE)
                launcher.emit(EventType.LAUNCHER_WORKER_START)
                ranks = [self._start(r, 200 + r, 1, 40) for r in (0, 1)]
                last = {r: time.monotonic() for r in (0, 1)}
            time.sleep(self.step_s)
            for r, j in enumerate(ranks):
                now = time.monotonic()
                j.emit(EventType.STEP, step=step, start=last[r], data_s=0.001, compute_s=self.step_s * 0.8,
                       optimizer_s=self.step_s * 0.1)
                if step == self.RESTART_AT:
                    self.first_step_after.append(now)
                last[r] = time.monotonic()
            if step % 20 == 0:
                self._save(ranks, step, last)
            self.progress = step
        for j in ranks:
            j.emit(EventType.PROCESS_END)
        launcher.emit(EventType.LAUNCHER_EXIT, code=0)
        self.done.set()

    def _start(self, rank: int, pid: int, restart: int, from_step: int | None) -> Journal:
        j = self._journal(rank, pid, restart)
        j.emit(EventType.PROCESS_START, world_size=2)
        t = time.monotonic()
        j.emit(EventType.RESTORE, start=t, step=from_step, path=None if from_step is None else "/ckpt", fallback=None)
        return j

    def _save(self, ranks: list[Journal], step: int, last: dict[int, float]) -> None:
        ckpt = f"step-{step:06d}"
        for r, j in enumerate(ranks):
            j.emit(EventType.CHECKPOINT_START, ckpt=ckpt, step=step, mode="async")
            j.emit(EventType.CHECKPOINT_SCHEDULED, ckpt=ckpt, plan_s=0.001, stage_s=0.002, bytes=1000)
            j.emit(EventType.CHECKPOINT_END, ckpt=ckpt, step=step, ok=True, written=time.monotonic(), error=None)
            last[r] = time.monotonic()


@pytest.mark.slow
@pytest.mark.external
def test_kill_and_restart_midrun_counts_once_and_equals_an_uninterrupted_run(tmp_path):
    """Two sidecars follow one live journal (it rotates, old generations are deleted): one runs
    throughout, the other is SIGKILLed past the restart and started again on its saved state."""
    journal = tmp_path / "journal"
    journal.mkdir()
    job = LiveJob(journal)
    writer = threading.Thread(target=job.run, daemon=True)
    seen: list[dict] = []
    with SidecarProcess(journal, tmp_path / "steady.json", tmp_path / "steady.log") as steady:
        with SidecarProcess(journal, tmp_path / "state.json", tmp_path / "sidecar.log",
                            "--state-interval", "0.2") as first:
            writer.start()
            first.wait_ready()
            steady.wait_ready()
            while job.progress < 70:  # past the restart
                seen.append(first.scrape())
                time.sleep(0.1)
            state = tmp_path / "state.json"
            before = state.stat().st_mtime_ns if state.exists() else None
            deadline = time.monotonic() + 30
            while (state.stat().st_mtime_ns if state.exists() else None) == before and time.monotonic() < deadline:
                time.sleep(0.05)  # until a periodic save of state past the restart
            first.stop(signal.SIGKILL)
        with SidecarProcess(journal, tmp_path / "state.json", tmp_path / "sidecar.log") as second:
            second.wait_ready()
            while not job.done.is_set():
                seen.append(second.scrape())
                time.sleep(0.1)
            seen.append(final := _until(second, _read(sum(j.written for j in job.journals))))
            status, body = second.get("/metrics")
            assert second.stop() == (0, b"")
        uninterrupted = _until(steady, _read(sum(j.written for j in job.journals)))
        assert steady.stop()[0] == 0

    # counters never went backwards, across the SIGKILL too
    for before, after in pairwise(seen):
        for key, v in counters(before).items():
            assert counters(after).get(key, v) >= v, key
    # the resumed sidecar ends exactly where one that never died does (the job has finished: wall stopped)
    assert counters(final) == counters(uninterrupted)
    assert value(final, "nvrx_restarts_total", level="injob") == 1
    assert value(final, "nvrx_restarts_total", level="inprocess") == 0
    assert value(final, "nvrx_steps_total", rank="0") == LiveJob.STEPS
    assert value(final, "nvrx_exporter_events_total") == sum(j.written for j in job.journals)
    assert all(v == 0 for (n, _), v in final.items() if n == "nvrx_exporter_rejected_events_total")
    # restart latency within 0.5 s of what the journal's own timestamps give
    expected = max(job.first_step_after) - job.fault_mono
    got = value(final, "nvrx_restart_duration_seconds_sum", level="injob")
    assert abs(got - expected) < 0.5, (got, expected)
    # the time accounting adds up, per rank
    for r in ("0", "1"):
        settled = sum(v for (n, ls), v in final.items() if n == "nvrx_time_seconds_total" and dict(ls)["rank"] == r)
        assert settled + value(final, "nvrx_unprotected_work_seconds", rank=r) == \
            pytest.approx(value(final, "nvrx_wall_seconds_total", rank=r), rel=1e-9)
    lint = subprocess.run([tool("promtool"), "check", "metrics"], input=body, capture_output=True, timeout=60)
    assert lint.returncode == 0 and lint.stdout + lint.stderr == b"", lint.stdout + lint.stderr


def _write(journal: Path, records: list[dict], shift: float = 0.0) -> None:
    """Append ``records`` to their files, their monotonic instants moved by ``shift``."""
    from nvrx_slo.contracts import schema

    for r in records:
        moved = {k: v + shift if k in ("mono", "start", "written") else v for k, v in r.items()}
        with open(journal / schema.journal_file_name(r["pod"], r["rank"], r["pid"]), "ab") as f:
            f.write(schema.encode(moved))


def _ends(records: list[dict]) -> tuple[list[dict], list[dict]]:
    ends = [r for r in records if r["type"] in ("process_end", "launcher_exit")]
    return [r for r in records if r not in ends], ends


def _until(proc: SidecarProcess, done: Callable[[dict], bool], timeout_s: float = 30.0) -> dict:
    """Scrape until ``done`` holds of a scrape (what a fixed sleep could only hope for), ``timeout_s`` at most."""
    deadline = time.monotonic() + timeout_s
    while not done(scraped := proc.scrape()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return scraped


def _read(records: int) -> Callable[[dict], bool]:
    """A scrape of a sidecar that has read ``records`` journal lines, accounted or refused."""
    return lambda s: value(s, "nvrx_exporter_events_total") + sum(
        v for (n, _), v in s.items() if n == "nvrx_exporter_rejected_events_total") >= records


def _settled(log: Path, timeout_s: float = 30.0) -> None:
    """Wait until a signalled sidecar has settled its final numbers: scrapes count from there."""
    deadline = time.monotonic() + timeout_s
    while "final numbers settled" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)


def _check_went_on(scrapes: list[dict]) -> None:
    for before, after in pairwise(scrapes):
        for key, v in counters(before).items():
            assert counters(after)[key] >= v, key
    for r in ("0", "1"):
        final = scrapes[-1]
        settled = sum(v for (n, ls), v in final.items() if n == "nvrx_time_seconds_total" and dict(ls)["rank"] == r)
        assert settled + value(final, "nvrx_unprotected_work_seconds", rank=r) == \
            pytest.approx(value(final, "nvrx_wall_seconds_total", rank=r), rel=1e-9)


def test_a_view_is_taken_at_the_start_of_the_last_poll_that_read_the_journal_to_its_end(tmp_path):

    write_clean(tmp_path / "journal")
    clock = [1000.0]
    live = Live(Engine(), JournalTail(tmp_path / "journal"), mono=lambda: clock[0], wall=lambda: clock[0] + 1e9)
    live.poll()
    clock[0] = 2000.0
    assert (live.view().snapshot.now_mono, live.view().snapshot.now_wall) == (1000.0, 1000.0 + 1e9)
    live.poll(stop=lambda: True)  # stopped before the end: proves nothing about what was written
    assert live.view().snapshot.now_mono == 1000.0
    live.poll()
    assert live.view().snapshot.now_mono == 2000.0


def test_wall_never_goes_down_when_a_scrape_comes_between_the_finish_and_its_reading(tmp_path):
    """A job journaled up to now; its ends are written after a poll and scraped before the next
    one reads them. Wall counts to the poll's start (the read horizon), so the end, read later,
    lies after it: no counter goes back, and the finished wall is the journal's own, exactly."""

    body, ends = _ends(crash_and_restart_records())
    journal = tmp_path / "journal"
    journal.mkdir()
    ran = time.monotonic() - 1.0 - max(r["mono"] for r in body)
    _write(journal, body, ran)  # written as it ran, ending a second ago
    with SidecarProcess(journal, tmp_path / "state.json", tmp_path / "log", "--poll-interval", "2") as proc:
        proc.wait_ready()
        running = proc.scrape()
        shift = time.monotonic() - min(r["mono"] for r in ends)  # the ends written now, as a live writer would
        _write(journal, ends, shift)
        between = proc.scrape()  # the next poll is ~2 s away: the ends are not read yet
        deadline = time.monotonic() + 30
        while (finished := proc.scrape()) == between and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.stop()
    _check_went_on([running, between, finished])
    job_wall = (max(r["mono"] for r in ends) + shift) - (min(r.get("start", r["mono"]) for r in body) + ran)
    for r in ("0", "1"):
        assert value(finished, "nvrx_wall_seconds_total", rank=r) == pytest.approx(job_wall, abs=1e-6)


def test_wall_never_goes_down_when_the_finish_was_stamped_before_a_scrape_that_missed_it(tmp_path):
    """A journal stamped long before it is read (copied in, or a writer stalled between reading
    its clock and writing): the horizon promise does not hold, so the engine ends the finished
    job's wall where it last showed it running rather than take seconds back."""

    body, ends = _ends(crash_and_restart_records())  # stamped at 0..40 s of a clock that has run far longer
    journal = tmp_path / "journal"
    journal.mkdir()
    _write(journal, body)
    with SidecarProcess(journal, tmp_path / "state.json", tmp_path / "log") as proc:
        proc.wait_ready()
        running = proc.scrape()
        _write(journal, ends)
        finished = _until(proc, _read(len(body) + len(ends)))
        proc.stop()
    assert value(running, "nvrx_wall_seconds_total", rank="0") > 40  # counted to the sidecar's now
    _check_went_on([running, finished])


def test_after_sigterm_the_job_end_is_read_and_served_to_two_more_scrapes(tmp_path):
    """The kubelet stops the sidecar right after the job's end, usually before the next scrape: with
    ``--final-scrape-timeout`` it reads the journal once more and serves until two scrapes have the
    finished job (its settled last seconds: the second keeps them fresh for the rules), then exits 0
    without waiting out the timeout."""

    body, ends = _ends(crash_and_restart_records())
    journal = tmp_path / "journal"
    journal.mkdir()
    ran = time.monotonic() - 1.0 - max(r["mono"] for r in body)
    _write(journal, body, ran)
    with SidecarProcess(journal, tmp_path / "state.json", tmp_path / "log", "--poll-interval", "60",
                        "--final-scrape-timeout", "60") as proc:
        proc.wait_ready()
        running = proc.scrape()
        _write(journal, ends, time.monotonic() - min(r["mono"] for r in ends))  # the job ends
        proc.proc.send_signal(signal.SIGTERM)  # at once: the next poll would be a minute away
        _settled(tmp_path / "log")
        assert proc.proc.poll() is None  # still serving, for the scrape that has the end
        final = proc.scrape()
        assert proc.proc.poll() is None  # and for one more, that keeps it fresh
        assert proc.scrape() == final
        stopped = time.monotonic()
        assert proc.proc.wait(timeout=10) == 0 and time.monotonic() - stopped < 10
    for r in ("0", "1"):  # the ends settled each rank's shutdown, which the running job had not
        shutdown = [value(s, "nvrx_time_seconds_total", rank=r, category="shutdown") for s in (running, final)]
        assert shutdown[0] == 0 < shutdown[1], (r, shutdown)
    _check_went_on([running, final])
    assert "final numbers scraped 2 times" in (tmp_path / "log").read_text()


def test_after_sigterm_without_a_scrape_the_sidecar_exits_at_the_final_scrape_timeout(tmp_path):

    journal = tmp_path / "journal"
    journal.mkdir()
    _write(journal, crash_and_restart_records())
    with SidecarProcess(journal, tmp_path / "state.json", tmp_path / "log", "--final-scrape-timeout", "1") as proc:
        proc.wait_ready()
        signalled = time.monotonic()
        code, _ = proc.stop()
        waited = time.monotonic() - signalled
    assert code == 0 and 1.0 <= waited < 10.0, waited
    assert "final numbers not scraped within 1 s; exiting" in (tmp_path / "log").read_text()


def test_after_sigterm_a_job_that_journaled_no_end_is_settled_for_its_final_scrapes(tmp_path):
    """Ranks killed with their pod journal no end, so their last seconds sit in the reorder window
    while the job runs; the pod's end (SIGTERM) settles them: the final scrapes have every record
    accounted, as a report of the same journal does."""

    body, _ = _ends(crash_and_restart_records())
    journal = tmp_path / "journal"
    journal.mkdir()
    _write(journal, body, time.monotonic() - 1.0 - max(r["mono"] for r in body))
    with SidecarProcess(journal, tmp_path / "state.json", tmp_path / "log", "--final-scrape-timeout", "60") as proc:
        proc.wait_ready()
        running = proc.scrape()
        proc.proc.send_signal(signal.SIGTERM)
        _settled(tmp_path / "log")
        final = proc.scrape()
        proc.scrape()
        assert proc.proc.wait(timeout=10) == 0
    with Replay(journal) as replay:
        replay.read_all()
    report = {r.rank: r.seconds for r in replay.view().snapshot.ranks}
    for r in ("0", "1"):
        held = value(running, "nvrx_unprotected_work_seconds", rank=r)
        assert held > 1.0 and value(final, "nvrx_unprotected_work_seconds", rank=r) < held
        for category in (Category.PRODUCTIVE, Category.LOST, Category.RESTART):
            got = value(final, "nvrx_time_seconds_total", rank=r, category=category.value)
            assert got == pytest.approx(report[int(r)][category], abs=1e-6), (r, category)
    _check_went_on([running, final])
