"""The benchmarks' journal (``bench/synthetic_journal.py``, run as its command) is one a real job
could have written, so that what a benchmark accounts from it means something: every record is
accepted, a restarted worker resumes after the step its restore names, the launcher exits last,
and the efficiency the engine accounts is the one the records themselves give."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from journal_truth import read_journal
from nvrx_slo.exporter.engine.engine import Engine
from nvrx_slo.exporter.ingest.tail import JournalTail

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "synthetic_journal.py"


@pytest.mark.parametrize(("steps", "restart_at"), [(1000, 500), (1000, 452), (300, None)])
def test_the_synthetic_journal_is_coherent_and_accounts_to_what_its_records_say(tmp_path, steps, restart_at):
    directory = tmp_path / "journal"
    args = ["--restart-at", str(restart_at)] if restart_at else []
    done = subprocess.run([sys.executable, str(SCRIPT), str(directory), "--ranks", "2", "--steps", str(steps), *args],
                          capture_output=True, text=True, timeout=60, check=True)
    events = int(done.stdout.split()[0])
    records = read_journal(directory)
    assert len(records) == events

    engine, tail = Engine(), JournalTail(directory)

    def ingest(batch: list) -> None:
        for event in batch:
            engine.ingest(event)

    tail.poll(ingest)
    tail.close()
    newest = records[-1]
    snap = engine.snapshot(newest["mono"], newest["wall"])
    assert dict(tail.rejected) == {} and snap.events_accepted == events
    assert (snap.duplicates, snap.out_of_order, snap.late, snap.implausible, snap.records_lost) == (0, 0, 0, 0, 0)
    assert snap.finished and newest["type"] == "launcher_exit"

    # each process's first step follows the step its restore names (a fresh start: step 1)
    for pid in {r["pid"] for r in records if r["rank"] is not None}:
        mine = [r for r in records if r["pid"] == pid]
        restored = next(r["step"] for r in mine if r["type"] == "restore")
        assert next(r["step"] for r in mine if r["type"] == "step") == (restored or 0) + 1, pid
    assert len([r for r in records if r["type"] == "restore"]) == 2 * (1 + (restart_at is not None))

    # the truth, from the records: each step's work in its last run counts once a later durable save
    # of its rank holds it; the wall is the world's two ranks over the journal's span
    kept: dict[tuple[int, int], float] = {}
    for r in records:
        if r["type"] == "step":
            kept[(r["rank"], r["step"])] = r["mono"] - r["start"] - r["data_s"]
    durable = {rank: max(r["step"] for r in records if r["type"] == "checkpoint_end" and r["ok"]
                         and r["rank"] == rank) for rank in (0, 1)}
    productive = sum(work for (rank, step), work in kept.items() if step <= durable[rank])
    wall = 2 * (newest["mono"] - records[0]["mono"])
    assert snap.wall_s == pytest.approx(wall, abs=1e-6)
    assert snap.efficiency == pytest.approx(productive / wall, abs=1e-6)
    assert 0.85 < snap.efficiency < 0.98  # half-second steps, a save every 50, a restart's few seconds
