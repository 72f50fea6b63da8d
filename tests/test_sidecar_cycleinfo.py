"""ft_launcher cycle-info files (newer NVRx) give a job without a launcher journal its restart phases."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from journal_fixtures import by_file
from nvrx_slo.contracts import schema
from nvrx_slo.contracts.catalogue import RestartLevel, RestartPhase
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.identity import PodIdentity
from nvrx_slo.exporter.ingest.cycleinfo import CycleInfoReader
from nvrx_slo.exporter.ingest.tail import JournalTail
from nvrx_slo.exporter.live import Live
from stories import crash_and_restart_records

IDENT = PodIdentity(namespace="ns", pod="pod-0", node="node-0", job_name="job")
OFFSET = 1.7e9  # the story's wall - mono


def iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, timezone.utc).isoformat()


def write_cycle(directory: Path, cycle: int, start: float, end: float | None) -> None:
    """As NVRx's CycleInfoWriter writes it (protobuf JSON, field names preserved)."""
    body = {"job_id": "4242", "attempt_index": 0, "cycle_number": cycle, "cycle_start_time": iso(start),
            "cycle_end_time": "" if end is None else iso(end), "cycle_log_file": "", "active_nodes": "node-0",
            "standby_nodes": "", "active_ranks": "0-1", "generation": 0 if end is None else 1}
    (directory / f"cycle_info.4242.0.{cycle}").write_text(json.dumps(body, indent=2))


def journal_without_launcher(directory: Path) -> list[dict]:
    records = crash_and_restart_records()
    directory.mkdir()
    for name, recs in by_file([r for r in records if r["rank"] is not None]).items():
        (directory / name).write_bytes(b"".join(schema.encode(r) for r in recs))
    return [r for r in records if r["rank"] is None]


def injob_restart(live: Live):
    live.poll()
    [restart] = [r for r in live.view().snapshot.restarts.recent if r.level is RestartLevel.INJOB]
    return restart


def test_cycles_give_the_restart_its_detect_and_rendezvous_phases(tmp_path):
    launcher = journal_without_launcher(tmp_path / "journal")
    at = {r["type"]: r["wall"] for r in launcher}
    cycles = tmp_path / "nvrx"
    cycles.mkdir()
    write_cycle(cycles, 0, at["launcher_worker_start"], at["launcher_failure_detected"])
    write_cycle(cycles, 1, at["launcher_rendezvous_done"], None)
    os.symlink("cycle_info.4242.0.1", cycles / "cycle_info.4242.current")
    (cycles / "cycle_info.4242.0.1.tmp").write_text("{half")

    bare = injob_restart(Live(Engine(), JournalTail(tmp_path / "journal")))
    reader = CycleInfoReader(cycles, IDENT, mono=lambda: 0.0, wall=lambda: OFFSET)
    live = Live(Engine(), JournalTail(tmp_path / "journal"), cycles=reader)
    restart = injob_restart(live)
    assert RestartPhase.DETECT not in bare.phases and RestartPhase.RENDEZVOUS not in bare.phases
    fault = min(r["mono"] for r in crash_and_restart_records() if r["type"] == "fault_injected")
    assert restart.phases[RestartPhase.DETECT] == pytest.approx(at["launcher_failure_detected"] - OFFSET - fault)
    assert restart.phases[RestartPhase.RENDEZVOUS] == pytest.approx(
        at["launcher_rendezvous_done"] - at["launcher_failure_detected"])
    assert restart.duration_s == pytest.approx(bare.duration_s)
    assert reader.poll() == []  # each cycle's records once

    resumed = CycleInfoReader(cycles, IDENT)
    resumed.load_state(live.to_state()["cycle_info"])
    assert resumed.poll() == []  # ...across a sidecar restart too


def test_a_torn_or_foreign_file_is_skipped_and_retried(tmp_path, caplog):
    (tmp_path / "cycle_info.4242.0.1").write_text('{"job_id": "4242", "cycle_start')
    (tmp_path / "notes.txt").write_text("hello")
    reader = CycleInfoReader(tmp_path, IDENT)
    assert reader.poll() == [] and "unreadable" in caplog.text
    write_cycle(tmp_path, 1, 1.7e9 + 5, None)
    [record] = reader.poll()
    assert record.type == "launcher_rendezvous_done" and record.pid == 0 and record.rank is None
