"""Persisted sidecar state: atomic replacement, and no state rather than a wrong one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from nvrx_slo.exporter import state_store


def test_round_trip_and_journal_binding(tmp_path):
    path, journal = tmp_path / "state.json", tmp_path / "journal"
    journal.mkdir()
    assert state_store.load(path, journal) is None
    state_store.save(path, journal, {"engine": {"a": [1, 2.5]}, "tail": {"offsets": {}}})
    assert state_store.load(path, journal) == {"engine": {"a": [1, 2.5]}, "tail": {"offsets": {}}}
    assert state_store.load(path, tmp_path) is None  # another journal directory: not ours
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_corrupt_or_foreign_files_give_no_state(tmp_path, caplog):
    path = tmp_path / "state.json"
    for body in (b"{not json", b"[1]", b'{"format": 99}'):
        path.write_bytes(body)
        assert state_store.load(path, tmp_path) is None
    assert "rebuilding from the journal" in caplog.text


def test_sigkill_while_saving_leaves_the_old_or_the_new_state(tmp_path):
    """A writer saving in a loop is killed at a random instant: the file always parses whole."""
    path = tmp_path / "state.json"
    code = ("import sys; from nvrx_slo.exporter import state_store\n"
            "i = 0\n"
            "while True:\n"
            "    i += 1\n"
            "    state_store.save(sys.argv[1], sys.argv[2], {'n': i, 'pad': 'x' * 200000})\n")
    for delay in (0.0, 0.05, 0.11):
        proc = subprocess.Popen([sys.executable, "-c", code, str(path), str(tmp_path)])
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        state = state_store.load(path, tmp_path)
        assert state is not None and state["n"] >= 1 and len(state["pad"]) == 200000
