"""promtool unit-test suites (tests/promtool/<spec>/*.yaml) against freshly generated rules.

Each folder under tests/promtool is one spec: the default ``alerts/slo.yaml`` with the top-level
keys of the folder's ``overrides.yaml``, if it has one. The rules are generated into a temporary
directory, next to a copy of the suite, which names them ``rules.yaml``. Needs Debian's
``promtool`` (scripts/test.sh installs it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from alert_suites import spec_for, suites
from needs import tool
from nvrx_slo.alerts import files as alert_files

pytestmark = pytest.mark.external


def _rules_for(folder: Path) -> str:
    s = spec_for(folder)
    return alert_files.render(s, s.plan(), "test")[alert_files.RULES]


@pytest.fixture(scope="module")
def promtool() -> str:
    return tool("promtool")


@pytest.mark.slow
@pytest.mark.parametrize("suite", suites(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_promtool_suite(suite: Path, promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(_rules_for(suite.parent), encoding="utf-8")
    shutil.copy(suite, tmp_path / suite.name)
    result = subprocess.run(
        [promtool, "test", "rules", suite.name], cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
