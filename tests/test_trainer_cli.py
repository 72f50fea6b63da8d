"""The trainer's commands on bad input, and a real 2-rank job whose journal directory is unwritable
(the launcher's) or fills up (the ranks'): training finishes, the journal loses only events."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nvrx_slo.contracts import schema
from nvrx_slo.trainer.reference.checkpoint import METADATA

pytestmark = pytest.mark.torch


def _nvrx_slo(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nvrx_slo", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("args, message", [
    (["train", "--checkpoint-dir", "x", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["train", "--steps", "10"], "required: --checkpoint-dir"),
    (["train", "--checkpoint-dir", "x", "--steps", "-1"], "--steps must be >= 0"),
    (["train", "--checkpoint-dir", "x", "--checkpoint-mode", "later"], "--checkpoint-mode: invalid choice"),
    (["demo", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    pytest.param(["ft-launcher", "--no-such-flag", "--nproc-per-node", "2", "-m", "nvrx_slo", "train"],
                 "nvrx-slo ft-launcher: error: unrecognized arguments: --no-such-flag", marks=pytest.mark.nvrx),
])
@pytest.mark.slow
def test_a_wrong_flag_is_named_and_exits_2(args, message):
    done = _nvrx_slo(*args)
    assert done.returncode == 2 and message in done.stderr, done.stderr[-2000:]


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 16 KiB tmpfs: a real device that fills up (ENOSPC), mounted for this test only."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.mark.slow
@pytest.mark.nvrx
def test_training_finishes_when_the_journal_is_unwritable_or_full(tmp_path, tiny_tmpfs):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, schema.JOURNAL_DIR_ENV: str(blocker / "journal"), "OMP_NUM_THREADS": "1", "GROUP_RANK": "0",
           "TORCH_CPP_LOG_LEVEL": "ERROR"}
    done = _nvrx_slo("ft-launcher", "--standalone", "--nproc-per-node", "2", "--max-restarts", "0",
                     "--monitor-interval", "0.5",
                     "-m", "nvrx_slo", "train", "--steps", "30", "--checkpoint-every", "10",
                     "--checkpoint-dir", str(ckpt), "--journal-dir", str(tiny_tmpfs), env=env, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (ckpt / "step-000029" / METADATA).is_file()
    logged = done.stdout + done.stderr
    assert logged.count("dropping events (training goes on)") == 3  # launcher + 2 ranks, once each
    files = sorted(tiny_tmpfs.iterdir())
    assert len(files) == 2
    kept = [schema.decode(line) for f in files for line in f.read_bytes().splitlines() if line.endswith(b"}")]
    assert {r["rank"] for r in kept} == {0, 1} and kept[0]["type"] == "process_start"
    steps = [r for r in kept if r["type"] == "step"]
    assert len(steps) < 2 * 30  # the device filled before the end: events were lost, not training
    assert sum(f.stat().st_size for f in files) > 8 * 1024
