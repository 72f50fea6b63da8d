"""Fixtures every test module may use: the expensive ones done once per session (a real multi-process
training run, the kustomize-rendered overlays) and the virtual clock (``virtual_clock.virtual_time``)."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

import fleet
from deploy_model import OVERLAYS, render
from fleet import Fleet
from journal_truth import read_journal
from nvrx_slo.trainer.reference.harness import DEFAULT_FAULTS, DemoResult
from virtual_clock import virtual_time  # noqa: F401 - a fixture every test module may use

# CI (``HYPOTHESIS_PROFILE=ci``, set by .ci/run) draws the same examples on every run, so a verdict
# is reproducible; runs elsewhere draw new ones, which is where property tests find new cases.
settings.register_profile("ci", derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@dataclass(frozen=True)
class DemoCommand:
    """One run of the README's first command, ``nvrx-slo demo``: its output and its run directory."""

    result: DemoResult
    stdout: str
    stderr: str


def _unplanned_rounds(run_dir: Path) -> str | None:
    """Why a finished run cannot be the planned faults' oracle: more worker processes than its
    faults explain (each crash starts a new round of both ranks; an exception restarts in-process)."""
    records = read_journal(run_dir / "journal")
    processes = {r["pid"] for r in records if r["rank"] is not None}
    planned = 2 * (1 + sum(1 for f in DEFAULT_FAULTS if f.kind == "crash"))
    if len(processes) <= planned:
        return None
    log = (run_dir / "demo.log").read_text(errors="replace").splitlines()
    marks = ("fn_ex", "term_ex", "Worker group", "exitcode", "Timed out", "timed out", "Stopping workers", "Error:")
    why = [line for line in log if any(m in line for m in marks) and "nvidia-ml" not in line and "NVML" not in line]
    return f"{len(processes)} rank processes for {planned} planned; the launcher's log:\n" + "\n".join(why[-30:])


@pytest.fixture(scope="session")
def demo_command(tmp_path_factory: pytest.TempPathFactory) -> DemoCommand:
    """``nvrx-slo demo`` as a user runs it: the default job (2 gloo ranks under ft_launcher +
    inprocess.Wrapper, one crash, one exception) with the real sidecar beside it.

    Its tests compare what nvrx-slo reports with the planned faults. A run the machine restarted
    once more on its own (seen once in CI on NVRx 0.6.0: a third round of workers; not reproduced
    in 20 runs on NVRx 0.6.0 here, 3 of them under full CPU load) is kept, reported as a warning
    with the launcher's log, and run again once; a second such run is what the tests see."""
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    for attempt in (1, 2):
        run_dir = tmp_path_factory.mktemp("demo") / "run"
        proc = subprocess.run([sys.executable, "-m", "nvrx_slo", "demo", "--run-dir", str(run_dir)],
                              capture_output=True, text=True, timeout=600, env=env)
        why = _unplanned_rounds(run_dir) if proc.returncode == 0 else None
        if why is None:
            break
        warnings.warn(f"demo run {attempt} in {run_dir}: {why}", stacklevel=1)
    result = DemoResult(run_dir, (run_dir / "journal",), run_dir / "checkpoints", run_dir / "demo.log", proc.returncode)
    return DemoCommand(result, proc.stdout, proc.stderr)


@pytest.fixture(scope="session")
def demo_run(demo_command: DemoCommand) -> DemoResult:
    """The demo's run directory. Tests read ``.journal_dir`` / ``.checkpoint_dir``; none may write there."""
    return demo_command.result


@pytest.fixture(scope="session")
def kustomized() -> dict[str, list[dict[str, Any]]]:
    """Each deploy overlay as ``kubectl kustomize`` renders it: what ``kubectl apply -k`` would send."""
    return {name: render(name) for name in OVERLAYS}


@pytest.fixture(scope="session")
def node_loss_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One two-pod node-loss demo scraped by Prometheus and VictoriaMetrics, each in one tier and in
    two (``tests/fleet.py``); VictoriaMetrics only where it is installed."""
    yield from fleet.run(tmp_path_factory.mktemp("fleet"))
