"""The step and restore hooks write the spans the schema describes, and only for completed work."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nvrx_slo.contracts import schema
from nvrx_slo.trainer.hooks import Hooks
from virtual_clock import CLOCK


def _records(directory):
    return [schema.decode(line) for path in sorted(directory.iterdir()) for line in path.read_bytes().splitlines()]


@pytest.mark.usefixtures("virtual_time")
def test_a_step_journals_its_span_and_phases(tmp_path):
    hooks = Hooks.start(world_size=2, journal_dir=str(tmp_path))
    with hooks.step(5) as s:
        with s.data():
            CLOCK.sleep(0.02)
        with s.compute():
            CLOCK.sleep(0.03)
        with s.optimizer():
            CLOCK.sleep(0.01)
    hooks.close()
    start, timing, step, end = _records(tmp_path)
    assert (start["type"], start["world_size"], end["type"]) == ("process_start", 2, "process_end")
    assert (timing["type"], timing["timer"], timing["step"]) == ("step_timing", "host", 5)
    assert step["type"] == "step" and step["step"] == 5
    assert 0.02 <= step["data_s"] < 0.06 and 0.03 <= step["compute_s"] < 0.07 and 0.01 <= step["optimizer_s"] < 0.05
    span = step["mono"] - step["start"]
    assert step["data_s"] + step["compute_s"] + step["optimizer_s"] <= span + 2e-6  # µs rounding


@pytest.mark.parametrize(("env", "journaled"), [("4", 4), (None, None), ("auto", None)])
def test_the_start_says_how_many_workers_the_launcher_runs_in_this_pod(tmp_path, monkeypatch, env, journaled):
    if env is None:
        monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("LOCAL_WORLD_SIZE", env)
    Hooks.start(world_size=8, journal_dir=str(tmp_path)).close()
    start = _records(tmp_path)[0]
    assert start["local_world_size"] == journaled


def test_a_step_that_raises_leaves_no_record(tmp_path):
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path))
    with pytest.raises(RuntimeError):
        with hooks.step(1) as s:
            with s.compute():
                raise RuntimeError("fault")
    with hooks.step(1):
        pass
    steps = [r for r in _records(tmp_path) if r["type"] == "step"]
    assert len(steps) == 1 and steps[0]["compute_s"] == 0.0  # phases reset between steps


def test_restore_journals_the_step_resumed_from_or_a_warning_when_it_fails(tmp_path):
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path))
    with hooks.restore() as r:
        r.step, r.path, r.fallback = 40, "/ckpt/step-000040", "step-000050: corrupt"
    assert r.next_step == 41
    with pytest.raises(OSError):
        with hooks.restore():
            raise OSError("disk gone")
    restore, warning = _records(tmp_path)[1:]
    assert restore["type"] == "restore" and restore["step"] == 40 and restore["fallback"] == "step-000050: corrupt"
    assert restore["start"] <= restore["mono"]
    assert warning["type"] == "warning" and "disk gone" in warning["message"]


@pytest.mark.usefixtures("virtual_time")
def test_a_user_span_journals_its_name_and_stretch_even_when_its_block_raises(tmp_path):
    hooks = Hooks.start(world_size=1, journal_dir=str(tmp_path))
    with hooks.span("eval"):
        CLOCK.sleep(0.03)
    with pytest.raises(ZeroDivisionError), hooks.span("sdc-check"):
        1 / 0  # noqa: B018 - the block raises; the span is still journaled, the exception goes on
    hooks.close()
    spans = [r for r in _records(tmp_path) if r["type"] == "user_span"]
    assert [s["name"] for s in spans] == ["eval", "sdc-check"]
    assert 0.03 <= spans[0]["mono"] - spans[0]["start"] < 0.5


EXITS = {
    "an uncaught exception": ("raise RuntimeError('boom at step 1')", 1, "RuntimeError: boom at step 1"),
    "the end of the script": ("pass", 0, None),
    "close() and then the end": ("slo.close()", 0, None),
    "a forked child's exit, then the parent's": (
        "import os\npid = os.fork()\nif pid == 0: os._exit(0)\nos.waitpid(pid, 0)", 0, None),
}


@pytest.mark.parametrize("name", EXITS)
def test_a_process_journals_its_end_once_however_it_exits(tmp_path, name):
    """A job launched without our launcher is over when every process journaled its end: the
    interpreter's exit journals it where the script did not call ``close()``, with the exception
    it exits with; a forked child (a data loader worker) journals nothing of its parent's."""
    body, code, error = EXITS[name]
    script = ("from nvrx_slo import Hooks\nslo = Hooks.start(world_size=1)\n"
              "with slo.step(0) as s:\n    pass\n" + body + "\n")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "NVRX_SLO_JOURNAL_DIR": str(tmp_path)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    (path,) = tmp_path.glob("*.jsonl")
    records = [schema.decode(line) for line in path.read_bytes().splitlines()]
    assert [r["type"] for r in records] == ["process_start", "step_timing", "step", "process_end"]
    assert records[-1].get("error") == error
