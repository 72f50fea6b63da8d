"""The demo's progress display: counts from the journal, a redrawn line on a TTY, plain lines elsewhere."""

from __future__ import annotations

import io
import time

from journal_builder import WALL_OFFSET
from journal_fixtures import write_journal
from nvrx_slo.exporter.engine.engine import REORDER_WINDOW_S
from nvrx_slo.exporter.offline.progress import PLAIN_EVERY_S, Progress
from nvrx_slo.trainer.hooks import Hooks
from stories import inprocess_job


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    """The journal's monotonic clock, moved by the test (the story's times are around 1000 s)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def mono(self) -> float:
        return self.now

    def wall(self) -> float:
        return self.now + WALL_OFFSET


def _cut(pod, until: float):
    """The story as far as it had been written at ``until``: each process's file up to its first
    record past ``until`` (a file only ever grows, so each cut extends the previous one)."""
    cut, stopped = type(pod)(), set()
    for r in pod.records:
        if r["mono"] > until:
            stopped.add(r["pid"])
        if r["pid"] not in stopped:
            cut.records.append(r)
    return cut


def test_plain_lines_when_something_happens_and_at_most_every_few_seconds_otherwise(tmp_path):
    pod = inprocess_job(ranks=2, steps=100, ckpt_every=20, fault_after=50, dt=0.5)
    fault = next(r["mono"] for r in pod.records if r["type"] == "inprocess_abort")
    end = max(r["mono"] for r in pod.records)
    clock, out = Clock(1003.0), io.StringIO()
    progress = Progress(tmp_path, out, clock=clock.mono, wall=clock.wall)

    write_journal(_cut(pod, 1003.0), tmp_path, evil=False)
    first = progress.update()
    assert out.getvalue() == first + "\n"
    assert "ranks 2 · step 5 · checkpoints 0 durable · restarts 0 ·" in first

    clock.now = 1004.0  # steps went on, but no checkpoint or restart: no new line yet
    write_journal(_cut(pod, 1004.0), tmp_path, evil=False)
    assert "step 7" in progress.update()
    assert out.getvalue().count("\n") == 1

    # a restart happened: a line as soon as the engine counts it (past its reorder window)
    clock.now = fault + REORDER_WINDOW_S + 2.0
    write_journal(_cut(pod, clock.now), tmp_path, evil=False)
    line = progress.update()
    assert "restarts 1 (1 inprocess)" in line
    assert out.getvalue().splitlines()[-1] == line

    clock.now += PLAIN_EVERY_S  # nothing new was written, but time passed: a line to show it is alive
    progress.update()
    assert out.getvalue().count("\n") == 3

    clock.now = end + 1.0
    write_journal(pod, tmp_path, evil=False)
    final = progress.stop()
    assert "step 100 · checkpoints 5 durable · restarts 1 (1 inprocess)" in final
    assert out.getvalue().splitlines()[-1] == final and "\r" not in out.getvalue()


def test_a_terminal_gets_one_line_redrawn_in_place(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")  # a narrow terminal: the line is cut, never wrapped
    pod = inprocess_job(ranks=2, steps=60, ckpt_every=20, fault_after=50)
    write_journal(pod, tmp_path, evil=False)
    end = max(r["mono"] for r in pod.records)
    clock, term = Clock(end), Terminal()
    progress = Progress(tmp_path, term, clock=clock.mono, wall=clock.wall)
    progress.update()
    progress.update()
    assert term.getvalue().count("\r") == 2 and term.getvalue().count("\x1b[K") == 2 and "\n" not in term.getvalue()
    final = progress.stop()
    assert term.getvalue().endswith("\r" + final[:39] + "\x1b[K\n")
    assert "step 60" in final and "checkpoints 3 durable" in final and "restarts 1 (1 inprocess)" in final


def test_it_follows_a_live_journal_written_by_the_real_hooks(tmp_path):
    out = io.StringIO()
    with Progress(tmp_path, out) as progress:
        hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path))
        with hooks.restore():
            pass
        for n in range(1, 6):
            with hooks.step(n):
                time.sleep(0.02)
        deadline = time.monotonic() + 10
        while "step 5" not in progress.update() and time.monotonic() < deadline:
            time.sleep(0.1)
        hooks.close()
    assert "ranks 1 · step 5 · checkpoints 0 durable · restarts 0" in out.getvalue().splitlines()[-1]
