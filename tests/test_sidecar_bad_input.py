"""Bad input: the sidecar counts every bad line by reason, keeps running, and accounts exactly as
it would for the same journal without the damage."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from journal_fixtures import by_file, make_unreadable, write_clean
from nvrx_slo.contracts import schema
from nvrx_slo.exporter import flags, sidecar, state_store
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.events import Event
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.live import Live
from sidecar_process import ACCOUNTING, SidecarProcess, scrape_in_process
from stories import crash_and_restart_records

GARBAGE = {  # reason -> lines (each a complete line, newline added)
    "malformed": [b'{"v":1,"type":"step","seq":3', b"\xff\xfe\xfd", b"NaN"],
    "not_an_object": [b"[1,2,3]", b"42"],
    "unknown_version": [b'{"v":2,"type":"step"}'],
    "unknown_type": [b'{"v":1,"type":"teleport"}'],
    "missing_field": [b'{"v":1,"type":"process_end","seq":1}'],
    "bad_field": [b'{"v":1,"type":"process_end","seq":"x","mono":1.0,"wall":1.0,"job":"","pod":"","node":"",'
                  b'"rank":0,"local_rank":0,"pid":1,"restart":0,"iter":0}'],
}


def write_dirty(directory: Path) -> dict[str, int]:
    """The clean journal, damaged: garbage lines, duplicated lines, neighbours swapped, the wall
    clock jumping, rank files split into rotated generations, a truncated tail, an unreadable file.
    Returns the rejections expected by reason."""
    directory.mkdir()
    expected = {reason: len(lines) for reason, lines in GARBAGE.items()}
    garbage = [line for lines in GARBAGE.values() for line in lines]
    for i, (name, records) in enumerate(by_file(crash_and_restart_records()).items()):
        lines = [schema.encode({**r, "wall": r["wall"] + (3600 if j % 7 == 3 else 0)})  # wall jumps: ignored
                 for j, r in enumerate(records)]
        for j in range(2, len(lines) - 2, 9):  # neighbours out of order (well inside the reorder window)
            lines[j], lines[j + 1] = lines[j + 1], lines[j]
        for j in (len(lines) // 3, len(lines) // 2):  # a record written twice
            lines.insert(j, lines[j])
            expected["duplicate"] = expected.get("duplicate", 0) + 1
        if i < len(garbage):
            lines.insert(len(lines) // 4, garbage[i] + b"\n")
        if name.split(".")[1].startswith("rank"):  # rotated: three generations, no renames
            third = len(lines) // 3
            stem = name[: -len(".jsonl")]
            (directory / name).write_bytes(b"".join(lines[:third]))
            (directory / f"{stem}.1.jsonl").write_bytes(b"".join(lines[third:2 * third]))
            (directory / f"{stem}.2.jsonl").write_bytes(b"".join(lines[2 * third:]))
        else:
            (directory / name).write_bytes(b"".join(lines))
    rest = garbage[len(by_file(crash_and_restart_records())):]
    (directory / "pod-0.rank-9.999.jsonl").write_bytes(b"".join(line + b"\n" for line in rest) + b'{"v":1,"ty')
    make_unreadable(directory / "pod-0.rank-8.998.jsonl")
    expected["unreadable"] = 1
    return expected


def test_damage_is_counted_by_reason_and_accounting_is_unchanged(tmp_path):
    write_clean(tmp_path / "clean")
    expected = write_dirty(tmp_path / "dirty")
    clean = scrape_in_process(tmp_path / "clean")
    with SidecarProcess(tmp_path / "dirty", tmp_path / "state.json", tmp_path / "log") as proc:
        proc.wait_ready()
        dirty = proc.scrape()
        status, page = proc.get("/")
        assert proc.stop()[0] == 0
    assert status == 200 and b"<html" in page.lower()
    rejected = {dict(k[1])["reason"]: v for k, v in dirty.items() if k[0] == "nvrx_exporter_rejected_events_total"}
    assert {r: n for r, n in rejected.items() if n} == expected
    # identity labels differ: the process reads its own environment
    for key, v in clean.items():
        if key[0] in ACCOUNTING:
            other = next(dv for (dn, dl), dv in dirty.items()
                         if dn == key[0] and {kv for kv in dl if kv[0] not in ("pod", "namespace", "job_name")}
                         == {kv for kv in key[1] if kv[0] not in ("pod", "namespace", "job_name")})
            assert other == pytest.approx(v, abs=1e-9), key
    assert clean[("nvrx_restarts_total", (("job_name", "job"), ("level", "injob"), ("namespace", "ns"),
                                          ("pod", "pod-0")))] == 1


def test_a_missing_journal_directory_is_not_ready_until_it_appears(tmp_path):
    with SidecarProcess(tmp_path / "later", tmp_path / "state.json", tmp_path / "log") as proc:
        assert proc.get("/healthz") == (200, b"ok\n")
        status, body = proc.get("/readyz")
        assert status == 503 and b"not readable" in body
        assert proc.get("/metrics")[0] == 503
        assert proc.get("/nope")[0] == 404
        write_clean(tmp_path / "later")
        proc.wait_ready()
        assert proc.scrape()
        assert proc.stop()[0] == 0


def test_an_unusable_state_file_means_a_rebuild_from_the_journal(tmp_path):
    write_clean(tmp_path / "journal")
    state = tmp_path / "state.json"
    journal_dir = (tmp_path / "journal").resolve()
    state.write_text(f'{{"format": 1, "journal_dir": "{journal_dir}", "engine": {{"nonsense": 1}}, "tail": {{}}}}')
    with SidecarProcess(tmp_path / "journal", state, tmp_path / "log") as proc:
        proc.wait_ready()
        got = proc.scrape()
        assert proc.stop()[0] == 0
    assert "reading the journal from the start" in (tmp_path / "log").read_text()
    assert sum(v for (n, _), v in got.items() if n == "nvrx_steps_total") == 100
    assert os.path.getsize(state) > 100  # saved again, whole


def test_a_state_accounted_with_another_reorder_window_is_accounted_again_with_the_flags(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    write_clean(tmp_path / "journal")
    state = tmp_path / "state.json"
    live = Live(Engine(10.0), JournalTail(tmp_path / "journal"))
    live.poll()
    state_store.save(state, tmp_path / "journal", live.to_state())
    for window, resumed in ((10.0, True), (1.0, False)):
        config = flags.parse_args(["--journal-dir", str(tmp_path / "journal"), "--state-file", str(state),
                                     "--reorder-window", str(window)])
        got = sidecar.resume(config, lambda w=window: Live(Engine(w), JournalTail(tmp_path / "journal")))
        assert got.engine.window == window and (got.engine.to_state()["counts"]["accepted"] > 0) == resumed
    assert "reorder window of 10 s, not 1 s" in caplog.text


def test_a_record_the_engine_raises_on_is_skipped_counted_and_the_rest_accounted(tmp_path, caplog):
    class Buggy(Engine):  # stands in for an engine bug, the one thing this test is about
        def ingest(self, record: Event, not_after: float = float("inf")) -> None:
            if record.type == "step" and record.step == 7 and record.rank == 1:
                raise ZeroDivisionError("a bug")
            super().ingest(record, not_after)

    write_clean(tmp_path / "journal")
    live = Live(Buggy(), JournalTail(tmp_path / "journal"))
    live.poll()
    view = live.view()
    assert view.rejected["engine_error"] == 1 and "ZeroDivisionError" in caplog.text
    assert [r.steps for r in view.snapshot.ranks] == [50, 49]
    resumed = Live(Engine(), JournalTail(tmp_path / "journal"))
    resumed.load_state(live.to_state())
    assert resumed.view().rejected["engine_error"] == 1
