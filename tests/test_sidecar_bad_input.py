"""Bad input: the sidecar counts every bad line by reason, keeps running, and accounts exactly as
it would for the same journal without the damage."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from journal_builder import Pod
from nvrx_slo.contracts import schema
from nvrx_slo.exporter import sidecar, state_store
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.identity import Identity
from nvrx_slo.exporter.ingest.decode import Event
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.live import Live
from nvrx_slo.exporter.views.collector import SnapshotCollector
from nvrx_slo.exporter.views.exposition import TextRenderer
from sidecar_process import SidecarProcess
from test_tail import _make_unreadable

IDENT = Identity(namespace="ns", pod="pod-0", node="node-0", job_name="job")


def story() -> list[dict]:
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


def by_file(records: list[dict]) -> dict[str, list[dict]]:
    files: dict[str, list[dict]] = {}
    for r in records:
        files.setdefault(schema.journal_file_name(r["pod"], r["rank"], r["pid"]), []).append(r)
    return files


def write_clean(directory: Path) -> None:
    directory.mkdir()
    for name, records in by_file(story()).items():
        (directory / name).write_bytes(b"".join(schema.encode(r) for r in records))


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
    for i, (name, records) in enumerate(by_file(story()).items()):
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
    rest = garbage[len(by_file(story())):]
    (directory / "pod-0.rank-9.999.jsonl").write_bytes(b"".join(line + b"\n" for line in rest) + b'{"v":1,"ty')
    _make_unreadable(directory / "pod-0.rank-8.998.jsonl")
    expected["unreadable"] = 1
    return expected


ACCOUNTING = ("nvrx_wall_seconds_total", "nvrx_time_seconds_total", "nvrx_unprotected_work_seconds",
              "nvrx_steps_total", "nvrx_restarts_total", "nvrx_restart_duration_seconds_sum",
              "nvrx_restart_phase_seconds_total", "nvrx_checkpoint_blocking_seconds_sum",
              "nvrx_checkpoint_background_seconds_sum", "nvrx_step_duration_seconds_count",
              "nvrx_training_step", "nvrx_checkpoint_last_step")


def samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def scrape_in_process(directory: Path) -> dict:
    live = Live(Engine(), JournalTail(directory))
    live.poll()
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(live.view, IDENT))
    return samples(TextRenderer().generate(registry).decode())


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
        config = sidecar.parse_args(["--journal-dir", str(tmp_path / "journal"), "--state-file", str(state),
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
