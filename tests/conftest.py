"""Shared, expensive fixtures: real multi-process training runs, each done once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
from hypothesis import settings

from nvrx_slo.trainer.demo import DemoResult

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


@pytest.fixture(scope="session")
def demo_command(tmp_path_factory: pytest.TempPathFactory) -> DemoCommand:
    """``nvrx-slo demo`` as a user runs it: the default job (2 gloo ranks under ft_launcher +
    inprocess.Wrapper, one crash, one exception) with the real sidecar beside it, run once."""
    run_dir = tmp_path_factory.mktemp("demo") / "run"
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    proc = subprocess.run([sys.executable, "-m", "nvrx_slo", "demo", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=600, env=env)
    result = DemoResult(run_dir, (run_dir / "journal",), run_dir / "checkpoints", run_dir / "demo.log", proc.returncode)
    return DemoCommand(result, proc.stdout, proc.stderr)


@pytest.fixture(scope="session")
def demo_run(demo_command: DemoCommand) -> DemoResult:
    """The demo's run directory. Tests read ``.journal_dir`` / ``.checkpoint_dir``; none may write there."""
    return demo_command.result
