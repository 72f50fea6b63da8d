"""The launcher's records span the launcher process's whole life, measured from outside it.

Ground truth is the test's own clock around the process (``Popen`` → ``wait``); the journal's
``launcher_start`` comes from the kernel's record of the process start, ``launcher_exit`` is the
last thing the process does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from needs import missing
from nvrx_slo.contracts.schema import EventType
from nvrx_slo.trainer import nvrx_compat
from nvrx_slo.trainer.ft_launcher import _launch_counts
from nvrx_slo.trainer.journal import Journal, Writer


def _records(directory: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(directory.glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_process_start_is_the_kernels_not_when_it_is_asked():
    before = time.monotonic()
    out = subprocess.run([sys.executable, "-c", "import time; time.sleep(0.5); "
                          "from nvrx_slo.trainer.journal import process_start_mono; print(process_start_mono())"],
                         capture_output=True, text=True, check=True).stdout
    started = float(out)
    assert before - 0.02 <= started <= before + 0.3, started - before  # clock ticks are 10 ms


def test_only_a_first_record_is_dated_back(tmp_path):
    journal = Journal(tmp_path, Writer.from_env({"RANK": "0"}))
    now = time.monotonic()
    journal.emit_first(EventType.PROCESS_START, now - 5.0, world_size=1)
    journal.emit_first(EventType.WARNING, now - 5.0, message="not first")
    first, second = _records(tmp_path)
    assert abs(first["mono"] - (now - 5.0)) < 1e-5 and abs((time.time() - first["wall"]) - 5.0) < 0.5
    assert second["mono"] >= now


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.nvrx
def test_the_launcher_journals_its_whole_life_as_measured_from_outside(tmp_path):
    env = {**os.environ, "NVRX_SLO_JOURNAL_DIR": str(tmp_path), "GROUP_RANK": "0"}
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "nvrx_slo", "ft-launcher", "--standalone", "--nproc-per-node", "1",
                           "--max-restarts", "0", "-m", "platform"], env=env, capture_output=True, text=True,
                          timeout=240)
    ended = time.monotonic()
    assert done.returncode == 0, done.stderr[-2000:]
    launcher = [r for r in _records(tmp_path) if r["rank"] is None]
    assert launcher[0]["type"] == "launcher_start" and launcher[-1]["type"] == "launcher_exit"
    assert (launcher[0]["local_world_size"], launcher[0]["world_size"], launcher[0]["max_restarts"]) == (1, 1, 0)
    assert abs(launcher[0]["mono"] - began) < 0.1, launcher[0]["mono"] - began  # not after the imports
    assert 0 <= ended - launcher[-1]["mono"] < 0.25, ended - launcher[-1]["mono"]  # nothing runs after it


@pytest.mark.parametrize("argv, counts", [
    (["--nnodes", "4", "--nproc-per-node", "8"], (8, 32)),
    (["--nnodes", "2:2", "--nproc-per-node", "1"], (1, 2)),
    (["--nnodes", "2:4", "--nproc-per-node", "8"], (8, None)),  # elastic: the world is not known ahead
    (["--nnodes", "2", "--nproc-per-node", "gpu"], (None, None)),
])
@pytest.mark.torch
@pytest.mark.nvrx
def test_the_launcher_says_its_workers_and_a_fixed_size_jobs_world_as_ft_launcher_parses_them(argv, counts):
    launcher = nvrx_compat.launcher()
    if launcher is None:
        missing("nvidia-resiliency-ext is not installed (the trainer extra; scripts/bootstrap.sh installs it)")
    said = _launch_counts(launcher, [*argv, "--max-restarts", "2", "train.py"])
    assert (said["local_world_size"], said["world_size"], said["max_restarts"]) == (*counts, 2)
