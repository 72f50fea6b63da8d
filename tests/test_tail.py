"""The journal follower against real files written by the real journal writer and by fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from journal_fixtures import file_name, make_unreadable, record, step, write
from nvrx_slo.contracts.schema import EventType
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.events import Event
from nvrx_slo.exporter.ingest import merge as merge_mod
from nvrx_slo.exporter.ingest import tail as tail_mod
from nvrx_slo.exporter.ingest.tail import JournalTail, order_key
from nvrx_slo.exporter.live import Live
from nvrx_slo.trainer.journal import Journal, Writer


class Sink:
    """The ingest callable: keeps what it is handed, in order."""

    def __init__(self) -> None:
        self.records: list[Event] = []

    def __call__(self, records: list[Event]) -> None:
        self.records += records

    def seqs(self, pid: int | None = None) -> list[int]:
        return [r.seq for r in self.records if pid is None or r.pid == pid]


def journal(tmp_path: Path, rank: int | None, pid: int, **kw) -> Journal:
    ident = Writer(job="j", pod="pod-0", node="n", rank=rank, local_rank=rank, pid=pid)
    return Journal(tmp_path, ident, **kw)


def emit_steps(j: Journal, n: int, first: int = 0) -> None:
    for i in range(first, first + n):
        j.emit(EventType.STEP, step=i, start=0.0, data_s=0.0, compute_s=0.0, optimizer_s=0.0)


def test_every_rank_restart_and_launcher_file_is_read_once(tmp_path):
    writers = [journal(tmp_path, 0, 11), journal(tmp_path, 1, 12), journal(tmp_path, None, 10),
               journal(tmp_path, 0, 21)]  # rank 0 again after a restart: a new pid, a new file
    for w in writers:
        emit_steps(w, 5)
    sink, t = Sink(), JournalTail(tmp_path)
    assert t.poll(sink) == 20
    assert sorted((r.pid, r.seq) for r in sink.records) == [(p, s) for p in (10, 11, 12, 21) for s in range(5)]
    assert t.poll(sink) == 0 and len(sink.records) == 20
    assert not t.rejected


def test_a_partial_last_line_waits_for_its_newline(tmp_path):
    path = tmp_path / file_name()
    line = b'{"v":1,"type":"process_end","seq":0,"mono":1.0,"wall":2.0,"job":"j","pod":"p","node":"n",' \
           b'"rank":0,"local_rank":0,"pid":100,"restart":0,"iter":0}\n'
    write(path, line[:40])
    sink, t = Sink(), JournalTail(tmp_path)
    t.poll(sink)
    assert sink.records == [] and not t.rejected
    write(path, line[40:-1])
    t.poll(sink)
    assert sink.records == []
    write(path, b"\n")
    t.poll(sink)
    assert sink.seqs() == [0] and not t.rejected


def test_files_appearing_late_and_a_directory_created_late(tmp_path):
    d = tmp_path / "journal"
    sink, t = Sink(), JournalTail(d)
    assert t.poll(sink) == 0 and not t.directory_ok
    d.mkdir()
    emit_steps(journal(d, 0, 1), 3)
    t.poll(sink)
    emit_steps(journal(d, 1, 2), 2)
    t.poll(sink)
    assert t.directory_ok and sorted(sink.seqs()) == [0, 0, 1, 1, 2]


def test_rotation_under_the_reader_loses_and_repeats_nothing(tmp_path):
    j = journal(tmp_path, 0, 7, max_bytes=1500, keep=2)  # ~6 records per generation
    sink, t = Sink(), JournalTail(tmp_path)
    emit_steps(j, 2)
    t.poll(sink)  # holds generation 0 open, part read
    for cycle in range(10):  # each cycle rotates once or twice and deletes the generation held open
        emit_steps(j, 8, first=2 + 8 * cycle)
        t.poll(sink)
    assert not (tmp_path / file_name(0, 7, 0)).exists() and not (tmp_path / file_name(0, 7, 10)).exists()
    assert sink.seqs() == list(range(82)) and not t.rejected
    assert len(t.offsets) == len(list(tmp_path.glob("*.jsonl")))  # deleted files are forgotten


def test_generations_are_read_in_write_order():
    names = [file_name(0, 7, g) for g in (10, 2, 0, 1)] + [file_name(1, 7), "my.pod.with.dots.rank-0.7.3.jsonl"]
    ordered = [n for n in sorted(names, key=order_key) if n.startswith("pod-0.rank-0.")]
    assert ordered == [file_name(0, 7, g) for g in (0, 1, 2, 10)]
    assert order_key("my.pod.with.dots.rank-0.7.3.jsonl")[:2] == ("my.pod.with.dots.rank-0.7", 3)


def test_bad_lines_are_counted_by_reason_and_good_lines_around_them_kept(tmp_path):
    good = [step(i, 10.0 + i, i) for i in range(4)]
    write(tmp_path / file_name(), good[0],
          b'{"v":1,"type":"step","seq"\n',  # truncated (a torn write, terminated by the next line)
          b"not json at all\n", b"[1,2,3]\n", b"\n",
          {**good[1], "v": 2}, {**good[1], "type": "teleport"},
          good[1], b'{"v":1,"type":"step","seq":9}\n',  # missing fields
          {**good[2], "step": "two"}, {**good[2], "mono": True}, b"\xff\xfe\n", good[2], good[3])
    sink, t = Sink(), JournalTail(tmp_path)
    t.poll(sink)
    assert sink.seqs() == [0, 1, 2, 3]
    assert dict(t.rejected) == {"malformed": 3, "not_an_object": 1, "unknown_version": 1, "unknown_type": 1,
                                "missing_field": 1, "bad_field": 2}


def test_an_over_long_line_is_rejected_once_and_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(merge_mod, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(tail_mod, "MIN_CHUNK", 256)
    path = tmp_path / file_name()
    write(path, step(0, 1.0, 0), b"x" * 3000)
    sink, t = Sink(), JournalTail(tmp_path, round_bytes=512)
    t.poll(sink)
    write(path, b"y" * 700 + b"\n", step(1, 2.0, 1))
    t.poll(sink)
    assert sink.seqs() == [0, 1] and dict(t.rejected) == {"malformed": 1}


def test_a_file_deleted_with_a_partial_line_counts_it_as_malformed(tmp_path):
    path = tmp_path / file_name()
    write(path, step(0, 1.0, 0), b'{"v":1,"type":"st')
    sink, t = Sink(), JournalTail(tmp_path)
    t.poll(sink)
    write(path, step(1, 2.0, 1))  # appended to the partial line: one garbled line...
    write(path, step(2, 3.0, 2))
    path.unlink()
    write(tmp_path / file_name(generation=1), step(3, 4.0, 3), b'{"v":1,"ty')
    t.poll(sink)
    assert sink.seqs() == [0, 2, 3] and dict(t.rejected) == {"malformed": 1}
    os.unlink(tmp_path / file_name(generation=1))
    t.poll(sink)  # ...and the deleted generation's partial tail: one more
    assert dict(t.rejected) == {"malformed": 2} and t.offsets == {}


def test_an_unreadable_file_is_counted_once_and_the_rest_still_read(tmp_path):
    make_unreadable(tmp_path / file_name(5, 55))
    write(tmp_path / file_name(), step(0, 1.0, 0))
    sink, t = Sink(), JournalTail(tmp_path)
    t.poll(sink)
    write(tmp_path / file_name(), step(1, 2.0, 1))
    t.poll(sink)
    assert sink.seqs() == [0, 1] and dict(t.rejected) == {"unreadable": 1}
    t2 = JournalTail(tmp_path)  # a restarted reader does not count the same episode again
    t2.load_state(t.to_state())
    t2.poll(Sink())
    assert dict(t2.rejected) == {"unreadable": 1}


@pytest.mark.parametrize("idle_close_s", [-1.0, 30.0])  # descriptor closed after each poll / held open
def test_a_file_shrinking_under_its_offset_is_counted_and_read_again_from_the_start(tmp_path, idle_close_s):
    path = tmp_path / file_name()
    write(path, *[step(i, 1.0 + i, i) for i in range(3)])
    sink, t = Sink(), JournalTail(tmp_path, idle_close_s=idle_close_s)
    t.poll(sink)
    with open(path, "r+b") as f:
        f.truncate(10)
    write(path, b"\n", step(3, 9.0, 3))  # the 10 bytes left are a torn line
    t.poll(sink)
    write(path, step(4, 10.0, 4))
    t.poll(sink)
    assert sink.seqs() == [0, 1, 2, 3, 4]
    assert dict(t.rejected) == {"file_truncated": 1, "malformed": 1}


def _copytruncate(path: Path) -> None:
    """What logrotate's ``copytruncate`` does to the file under the writer: copy it away, cut it to 0."""
    path.with_suffix(".1").write_bytes(path.read_bytes())
    with open(path, "r+b") as f:
        f.truncate(0)


@pytest.mark.parametrize("held", ["held open", "closed when idle", "sidecar restarted"])
def test_a_file_cut_and_rewritten_past_the_offset_between_polls_is_read_again_from_its_start(tmp_path, held):
    """Read to 100 lines, cut, then 150 lines at once: the file is longer than the offset again, so
    the reader went on from it — 100 records lost (and a torn line) with nothing counted."""
    path = tmp_path / file_name()
    write(path, *[step(i, 1.0 + i, i) for i in range(100)])
    sink, t = Sink(), JournalTail(tmp_path, idle_close_s=-1.0 if held == "closed when idle" else 30.0)
    t.poll(sink)
    _copytruncate(path)
    write(path, *[step(i, 1.0 + i, i) for i in range(100, 250)])  # the writer goes on: its next seqs
    if held == "sidecar restarted":
        t.close()
        state, t = t.to_state(), JournalTail(tmp_path)
        t.load_state(state)
    t.poll(sink)
    assert sink.seqs() == list(range(250))
    assert dict(t.rejected) == {"file_truncated": 1}
    write(path, step(250, 251.0, 250))  # and it is followed as before
    t.poll(sink)
    assert sink.seqs()[-1] == 250 and dict(t.rejected) == {"file_truncated": 1}


def test_lines_cut_away_before_they_were_read_are_counted_lost(tmp_path):
    """The reader stopped at line 100; the writer wrote 20 more, then the file was cut and written
    again: those 20 are gone with the copy. The reader reads what is there from the start and the
    engine counts the 20 seqs it never saw as lost (nvrx_exporter_journal_records_lost_total)."""
    path = tmp_path / file_name()
    write(path, *[step(i, 1.0 + i, i) for i in range(100)])
    live = Live(Engine(), JournalTail(tmp_path), mono=lambda: 1000.0, wall=lambda: 1000.0 + 1.7e9)
    live.poll()
    write(path, *[step(i, 1.0 + i, i) for i in range(100, 120)])
    _copytruncate(path)
    write(path, *[step(i, 1.0 + i, i) for i in range(120, 270)])
    live.poll()
    view = live.view()
    assert view.snapshot.records_lost == 20
    assert view.rejected["file_truncated"] == 1 and view.snapshot.events_accepted == 250
    assert sum(r.steps for r in view.snapshot.ranks) == 250


def test_resume_from_saved_state_reads_only_what_is_new(tmp_path):
    j = journal(tmp_path, 0, 3, max_bytes=2000, keep=20)
    emit_steps(j, 20)
    first, t = Sink(), JournalTail(tmp_path)
    t.poll(first)
    state = t.to_state()
    emit_steps(j, 20, first=20)
    second, resumed = Sink(), JournalTail(tmp_path)
    resumed.load_state(state)
    resumed.poll(second)
    assert first.seqs() + second.seqs() == list(range(40))


def test_stop_interrupts_between_rounds_with_consistent_offsets(tmp_path, monkeypatch):
    monkeypatch.setattr(tail_mod, "MIN_CHUNK", 1024)
    write(tmp_path / file_name(), *[step(i, 1.0 + i, i) for i in range(200)])
    sink, t = Sink(), JournalTail(tmp_path, round_bytes=4096)
    t.poll(sink, stop=lambda: len(sink.records) > 0)
    got = len(sink.records)
    assert 0 < got < 200
    resumed = JournalTail(tmp_path)
    resumed.load_state(t.to_state())
    resumed.poll(sink)
    assert sink.seqs() == list(range(200))


def test_many_files_stay_under_the_descriptor_cap(tmp_path):
    for rank in range(40):
        write(tmp_path / file_name(rank, 1000 + rank), record("process_start", 0, 1.0, rank=rank,
                                                              pid=1000 + rank, world_size=40))
    sink, t = Sink(), JournalTail(tmp_path, max_open=8)
    t.poll(sink)
    assert len(t._open) <= 8 and len(sink.records) == 40
    for rank in range(40):
        write(tmp_path / file_name(rank, 1000 + rank), record("process_end", 1, 2.0, rank=rank, pid=1000 + rank))
    t.poll(sink)
    assert len(sink.records) == 80 and not t.rejected


def test_a_backlog_is_handed_on_merged_by_time_across_files(tmp_path, monkeypatch):
    """A late-started reader gets each rank's restarts and the launcher interleaved by mono."""
    monkeypatch.setattr(tail_mod, "MIN_CHUNK", 2048)
    old, new, launcher, rank1 = [], [], [], []
    for i in range(60):
        old.append(step(i, 100.0 + i, i, pid=11))  # rank 0 before its restart
        new.append(step(i, 200.0 + i, i, pid=21))  # rank 0 after it (a smaller pid: no order by name)
        rank1.append(step(i, 100.5 + 2 * i, i, rank=1, pid=12))
    launcher = [record("launcher_worker_start", i, 90.0 + 50 * i, rank=None, pid=5) for i in range(5)]
    write(tmp_path / file_name(0, 11), *old)
    write(tmp_path / file_name(0, 21), *new)
    write(tmp_path / file_name(1, 12), *rank1)
    write(tmp_path / file_name(None, 5), *launcher)
    sink, t = Sink(), JournalTail(tmp_path, round_bytes=4096)
    t.poll(sink)
    monos = [r.mono for r in sink.records]
    assert len(monos) == 185 and monos == sorted(monos)
