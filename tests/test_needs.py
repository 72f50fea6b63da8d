"""A test whose tool is missing skips saying what to install, except under scripts/test.sh, which installs
every tool and sets NVRX_SLO_TESTS_NEED_ALL: there it fails, so a broken install is not a run of skips."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

import needs

ROOT = Path(__file__).resolve().parents[1]


def test_a_missing_tool_skips_naming_its_package_or_fails_where_everything_must_be_installed(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv(needs.NEED_ALL, raising=False)
    with pytest.raises(pytest.skip.Exception, match="promtool is not installed .Debian's prometheus package"):
        needs.tool("promtool")
    monkeypatch.setenv(needs.NEED_ALL, "1")
    with pytest.raises(pytest.fail.Exception, match="chromium is not installed .* must be there"):
        needs.tool("chromium")


def test_the_test_command_sets_it_after_installing_and_before_pytest():
    lines = (ROOT / "scripts" / "test.sh").read_text().splitlines()
    setting = next(i for i, line in enumerate(lines) if line.startswith(f"export {needs.NEED_ALL}=1"))
    installing = next(i for i, line in enumerate(lines) if "bash scripts/bootstrap.sh" in line)
    testing = next(i for i, line in enumerate(lines) if "-m pytest" in line)
    assert installing < setting < testing


def test_the_test_command_installs_every_package_a_test_may_need():
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert {p for p in needs.PACKAGE.values()} <= set(re.findall(r"need\+=\(([\w-]+)\)", script))
