"""The journal writer: schema-valid lines, identity, rotation, concurrency, and never raising."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import threading
from pathlib import Path

import pytest

from nvrx_slo.contracts import schema
from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer.hooks import Hooks
from nvrx_slo.trainer.journal import Journal, Writer, open_journal

ENV = {"NVRX_SLO_JOB": "llm", "POD_NAME": "llm-0", "NODE_NAME": "n1", "RANK": "3", "LOCAL_RANK": "1",
       "TORCHELASTIC_RESTART_COUNT": "2", "HOSTNAME": "ignored-when-pod-name-set"}


def _records(directory: Path) -> list[dict]:
    return [schema.decode(line) for path in sorted(directory.iterdir()) for line in path.read_bytes().splitlines()]


def test_identity_comes_from_the_downward_api_and_torchelastic_env():
    ident = Writer.from_env(ENV)
    assert (ident.job, ident.pod, ident.node, ident.rank, ident.local_rank, ident.restart, ident.iter) == \
        ("llm", "llm-0", "n1", 3, 1, 2, 0)
    launcher = Writer.from_env(ENV, launcher=True)
    assert launcher.rank is None and launcher.local_rank is None


def test_every_line_is_a_valid_record_with_identity_and_increasing_seq(tmp_path):
    journal = Journal(tmp_path, Writer.from_env(ENV))
    journal.emit(EventType.PROCESS_START, world_size=4)
    journal.step(7, 1.25, 0.5, 0.25, 0.125)
    journal.update(iter=1)
    journal.emit(EventType.WARNING, message='quote " newline \n ünïcode')
    journal.emit(EventType.CHECKPOINT_END, ckpt="step-000007", step=7, ok=False, written=2.0, error=None)
    records = _records(tmp_path)
    assert [r["type"] for r in records] == ["process_start", "step", "warning", "checkpoint_end"]
    assert [r["seq"] for r in records] == [0, 1, 2, 3]
    assert [r["iter"] for r in records] == [0, 0, 1, 1]
    assert {k: records[1][k] for k in ("step", "start", "data_s", "compute_s", "optimizer_s")} == \
        {"step": 7, "start": 1.25, "data_s": 0.5, "compute_s": 0.25, "optimizer_s": 0.125}
    assert records[2]["message"] == 'quote " newline \n ünïcode'
    assert all(r["pod"] == "llm-0" and r["rank"] == 3 and r["restart"] == 2 for r in records)
    assert records[0]["mono"] <= records[-1]["mono"]
    name = schema.journal_file_name("llm-0", 3, os.getpid())
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_a_payload_that_is_not_json_is_dropped_and_counted(tmp_path):
    journal = Journal(tmp_path, Writer.from_env(ENV))
    journal.emit(EventType.WARNING, message=float("nan"))
    journal.emit(EventType.WARNING, message=object())
    journal.emit(EventType.PROCESS_END)
    assert journal.errors == 2
    assert [r["seq"] for r in _records(tmp_path)] == [0]


def test_rotation_starts_new_generations_and_deletes_the_oldest_without_renaming(tmp_path):
    journal = Journal(tmp_path, Writer.from_env(ENV), max_bytes=2000, keep=3)
    first = journal.path()
    for i in range(60):  # ~330 bytes each: ~6 per file, ~10 generations
        journal.step(i, 1.0, 0.0, 0.0, 0.0)
    files = sorted(tmp_path.iterdir(), key=lambda p: p.stat().st_mtime_ns)
    pid = os.getpid()
    gen = journal._generation
    assert gen >= 5
    assert [p.name for p in files] == [schema.journal_file_name("llm-0", 3, pid, g) for g in range(gen - 2, gen + 1)]
    assert not first.exists()  # generation 0 deleted, never renamed
    assert all(p.stat().st_size <= 2000 for p in files)
    steps = [r["step"] for r in _records(tmp_path)]
    assert sorted(steps) == list(range(60 - len(steps), 60))  # the newest survive, whole and in order


def test_an_unwritable_directory_loses_events_not_training(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    journal = open_journal(blocker / "journal")  # ENOTDIR even for root
    hooks = Hooks(journal)
    for step in range(3):
        with hooks.step(step) as s:
            with s.compute():
                pass
    hooks.warning("still going")
    assert journal.errors == 4 and journal.written == 0
    assert len([r for r in caplog.records if "dropping events" in r.getMessage()]) == 1  # logged once


def test_a_full_device_tears_no_line_apart(tmp_path):
    """Writes that fail midway (ENOSPC) leave the next record on its own line."""
    journal = Journal(tmp_path, Writer.from_env(ENV))
    journal.emit(EventType.PROCESS_START, world_size=1)
    real = journal._fd
    full = os.open("/dev/full", os.O_WRONLY)
    journal._fd = full  # the seam: a descriptor whose writes fail with ENOSPC
    journal.emit(EventType.WARNING, message="lost")
    journal._fd = real
    os.close(full)
    journal.emit(EventType.PROCESS_END)
    assert journal.errors == 1
    assert [r["type"] for r in _records(tmp_path)] == ["process_start", "process_end"]


def _append_many(directory: str, ident: Writer, count: int, start: mp.synchronize.Event) -> None:
    journal = Journal(directory, ident)
    start.wait()
    for i in range(count):
        journal.emit(EventType.WARNING, message=f"{os.getpid()}:{i}:" + "x" * 3000)


def test_concurrent_processes_and_threads_appending_to_one_file_write_only_whole_lines(tmp_path):
    """Same file on purpose (shared pid in the identity): O_APPEND + one write() per line."""
    ident = Writer.from_env(ENV)
    ctx = mp.get_context("fork")
    start = ctx.Event()
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), ident, 300, start)) for _ in range(6)]
    for p in procs:
        p.start()
    shared = Journal(tmp_path, dataclasses.replace(ident))
    threads = [threading.Thread(target=lambda: [shared.emit(EventType.WARNING, message="t" * 5000)
                                                for _ in range(300)]) for _ in range(4)]
    start.set()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    lines = next(tmp_path.iterdir()).read_bytes().splitlines()
    assert len(lines) == 6 * 300 + 4 * 300
    records = [schema.decode(line) for line in lines]  # raises on any torn line
    per_writer: dict[str, list[int]] = {}
    for r in records:
        if r["message"][0] != "t":
            pid, i, _ = r["message"].split(":")
            per_writer.setdefault(pid, []).append(int(i))
    assert all(seq == list(range(300)) for seq in per_writer.values()) and len(per_writer) == 6


def test_a_disabled_journal_is_a_no_op(monkeypatch):
    monkeypatch.delenv(schema.JOURNAL_DIR_ENV, raising=False)
    journal = open_journal()
    journal.emit(EventType.PROCESS_END)
    assert not journal.enabled and journal.written == 0 and journal.errors == 0


@pytest.mark.parametrize("kwargs", [{"max_bytes": 0}, {"keep": 0}])
def test_bad_rotation_settings_are_refused(tmp_path, kwargs):
    with pytest.raises(ValueError, match="max_bytes > 0 and keep >= 1"):
        Journal(tmp_path, Writer.from_env(ENV), **kwargs)
