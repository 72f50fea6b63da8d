"""The GPU check (``bench/gpu_check.py``) on this machine, which has no GPU: every section runs its CPU
fallback (the simulated CUDA device of ``tests/sim_cuda.py`` on the host's real clock, gloo, CPU ranks)
and the CUDA-only one skips with its reason, so the check cannot rot. Its GPU numbers come only from
a GPU (docs/gpu.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.torch, pytest.mark.nvrx]
CHECK = Path(__file__).parent.parent / "bench" / "gpu_check.py"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check") / "results.json"
    done = subprocess.run([sys.executable, str(CHECK), "--json", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "section | verdict | what | measured | target" in done.stdout  # the table
    return json.loads(out.read_text())


def _rows(results, section):
    return [r for r in results["rows"] if r["section"] == section]


def test_without_cuda_every_section_runs_its_fallback_and_nvml_skips_with_its_reason(results):
    assert results["cuda"] is False
    assert {r["section"] for r in results["rows"]} == set("abcde")
    (nvml,) = _rows(results, "e")
    assert nvml["verdict"] == "skipped" and "no CUDA device" in nvml["measured"]
    assert all(r["verdict"] != "skipped" for r in results["rows"] if r["section"] != "e")


def test_the_phase_check_tells_host_clocks_misbooking_from_the_default_timing(results):
    rows = {(r["loop"], r["timing"]): r["errors_ms"] for r in _rows(results, "b")}
    for loop in ("sync in data phase", "GPU-bound", "late CUDA"):  # late: CUDA first used after step 0
        assert all(abs(e) <= 0.5 for e in rows[(loop, "auto")].values())
    for loop in ("sync in data phase", "GPU-bound"):
        assert rows[(loop, "host")]["compute"] < -10  # the planted 12 ms, booked elsewhere
    assert rows[("sync in data phase", "host")]["data"] > 10  # as data wait: the direction that pages


def test_every_save_path_journals_the_blocking_the_loop_measured(results):
    rows = {r["path"]: r for r in _rows(results, "c")}
    readme = {"NVRx README, wrapped", "NVRx README, handed over", "NVRx README, unwrapped"}
    assert set(rows) == {"dcp.save", "dcp.async_save", "NVRx async"} | readme
    assert all(len(r["errors_ms"]) == 3 for r in rows.values())
    assert all(r["verdict"] == "ok" for path, r in rows.items() if path != "NVRx README, unwrapped")
    # polls the hooks never saw: every save short by its polls (the other two paths book them)
    assert all(e < 0 for e in rows["NVRx README, unwrapped"]["errors_ms"])


def test_restarts_are_read_back_by_phase_and_overhead_is_reported(results):
    levels = {r["level"]: r for r in _rows(results, "d")}
    assert set(levels) == {"injob", "inprocess"}
    assert all(r["seconds"] > 0 and abs(sum(r["phases"].values()) - r["seconds"]) < 0.01 for r in levels.values())
    overhead = _rows(results, "a")
    assert overhead[0]["ratio"] > 0 and {r.get("timer") for r in overhead[1:]} == {"host clocks", "CUDA events"}
