"""promtool unit-test suites (tests/promtool/<spec>/*.yaml) against freshly generated rules.

Each folder under tests/promtool is one spec: its ``slo.yaml`` if it has one, else the default
``alerts/slo.yaml``. The rules are generated into a temporary copy of the folder, next to the
suites, which name them ``rules.yaml``. Needs Debian's ``promtool`` (scripts/test.sh installs it).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from alerts import generate, spec

SUITES = Path(__file__).parent / "promtool"
SPEC_FILE = "slo.yaml"


def _suites() -> list[Path]:
    return sorted(p for p in SUITES.glob("*/*.yaml") if p.name != SPEC_FILE)


def _rules_for(folder: Path) -> str:
    own = folder / SPEC_FILE
    loaded = spec.load(own) if own.exists() else spec.load()
    return generate.render(loaded, "test")[generate.RULES]


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed (scripts/test.sh installs Debian's prometheus package)")
    return path


@pytest.mark.parametrize("suite", _suites(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_promtool_suite(suite: Path, promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(_rules_for(suite.parent), encoding="utf-8")
    shutil.copy(suite, tmp_path / suite.name)
    result = subprocess.run(
        [promtool, "test", "rules", suite.name], cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
