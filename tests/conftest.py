"""Shared, expensive fixtures: real multi-process training runs, each done once per session."""

from __future__ import annotations

import pytest

from trainer.demo import DemoResult, run_demo


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> DemoResult:
    """The default demo (2 gloo ranks under ft_launcher + inprocess.Wrapper, one crash, one
    exception), run once. Tests read ``.journal_dir`` / ``.checkpoint_dir``; none may write there."""
    return run_demo(tmp_path_factory.mktemp("demo") / "run")
