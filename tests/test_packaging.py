"""The install's shape: the rooms are top-level folders here but import only as ``nvrx_slo.*``.

A user's training repo often has its own ``trainer`` package, so nothing of ours may install under
a generic top-level name. The wheel is built from this checkout as pip would build it; the editable
install is the project venv's own (scripts/bootstrap.sh).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("trainer", "exporter", "alerts", "dashboards")
SHIPPED = ("*.py", "slo.yaml", "templates/*.css")


def shipped_files() -> set[str]:
    """Every file the rooms and ``nvrx_slo/`` ship, as its path inside the wheel."""
    files = {f"nvrx_slo/{p.relative_to(ROOT / 'nvrx_slo')}" for p in (ROOT / "nvrx_slo").rglob("*.py")}
    for room in ROOMS:
        for pattern in SHIPPED:
            files |= {f"nvrx_slo/{room}/{p.relative_to(ROOT / room)}" for p in (ROOT / room).glob(pattern)}
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)], check=True, capture_output=True, timeout=180)
    (built,) = out.glob("nvrx_slo-*.whl")
    return built


def test_the_wheel_ships_every_module_under_nvrx_slo_and_nothing_at_the_top(wheel):
    names = {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}
    assert names == shipped_files()


def test_the_editable_install_imports_nvrx_slo_rooms_and_no_generic_names(tmp_path):
    code = ("import importlib.util, nvrx_slo.trainer.hooks, nvrx_slo.exporter.catalogue, nvrx_slo.alerts.spec, "
            "nvrx_slo.dashboards; print([importlib.util.find_spec(r) is None for r in "
            f"{ROOMS!r}])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str([True] * len(ROOMS))
