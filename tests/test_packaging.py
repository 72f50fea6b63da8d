"""The install's shape: the rooms are top-level folders here but import only as ``nvrx_slo.*``.

A user's training repo often has its own ``trainer`` package, so nothing of ours may install under
a generic top-level name. Wheels are built from a clean copy of the sources (an in-tree build would
package whatever a previous build left in ``build/``); the editable install is the project venv's
own (scripts/bootstrap.sh).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("trainer", "exporter", "alerts", "dashboards")
SHIPPED = ("**/*.py", "slo.yaml", "**/templates/*.css")


def shipped_files() -> set[str]:
    """Every file the rooms and ``nvrx_slo/`` ship, as its path inside the wheel."""
    files = {f"nvrx_slo/{p.relative_to(ROOT / 'nvrx_slo')}" for p in (ROOT / "nvrx_slo").rglob("*.py")}
    files.add("nvrx_slo/sidecar_pod.yaml")  # what `nvrx-slo inject` adds to a pod
    for room in ROOMS:
        for pattern in SHIPPED:
            files |= {f"nvrx_slo/{room}/{p.relative_to(ROOT / room)}" for p in (ROOT / room).glob(pattern)}
    return files


def source_copy(dest: Path) -> Path:
    """Copy into ``dest`` what a source distribution holds: the project file, the README,
    ``nvrx_slo/`` and the rooms."""
    dest.mkdir(exist_ok=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("nvrx_slo", *ROOMS):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = source_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(src)],
                          check=True, capture_output=True, text=True, timeout=180)
    (built,) = out.glob("nvrx_slo-*.whl")
    (out / "build.log").write_text(done.stdout + done.stderr)  # what a user's pip shows of the build
    return built


@pytest.mark.slow
def test_the_wheel_ships_every_module_under_nvrx_slo_and_nothing_else(wheel):
    names = {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}
    assert names == shipped_files()


@pytest.mark.slow
def test_the_build_warns_nothing_and_the_wheel_states_its_license_as_an_spdx_expression(wheel):
    log = (wheel.parent / "build.log").read_text()
    assert "warning" not in log.lower(), log[-3000:]  # setuptools deprecated project.license as a table
    metadata = zipfile.ZipFile(wheel).read("nvrx_slo-0.1.0.dist-info/METADATA").decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()


def test_the_editable_install_imports_nvrx_slo_rooms_and_no_generic_names(tmp_path):
    code = ("import importlib.util, nvrx_slo.trainer.hooks, nvrx_slo.contracts.catalogue, nvrx_slo.alerts.spec, "
            "nvrx_slo.dashboards; print([importlib.util.find_spec(r) is None for r in "
            f"{ROOMS!r}])")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str([True] * len(ROOMS))


BASE_VENV_SCRIPT = """
import importlib.util, json, pathlib, sys
from nvrx_slo.contracts import schema
from nvrx_slo import Hooks

slo = Hooks.start(world_size=1, journal_dir=sys.argv[1])
with slo.step(0) as s:
    with s.compute():
        pass
slo.close()
(path,) = pathlib.Path(sys.argv[1]).glob("*.jsonl")
types = [schema.decode(line)["type"] for line in path.read_bytes().splitlines()]
print(json.dumps({"types": types, "trainer": importlib.util.find_spec("trainer") is not None}))
"""


@pytest.mark.slow
def test_a_training_venv_with_only_the_base_install_journals_a_step(tmp_path):
    """`pip install nvrx-slo` (dependencies resolved, no extras) is enough for a training process."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    src = source_copy(tmp_path / "src")
    subprocess.run([venv / "bin" / "pip", "install", "--quiet", str(src)], check=True, timeout=240)
    listed = subprocess.run([venv / "bin" / "pip", "list", "--format=json"], capture_output=True, text=True,
                            check=True).stdout
    assert {p["name"].lower() for p in json.loads(listed)} - {"pip", "setuptools"} == {"nvrx-slo"}

    journal = tmp_path / "journal"
    out = subprocess.run([venv / "bin" / "python", "-c", BASE_VENV_SCRIPT, str(journal)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout)
    assert result == {"types": ["process_start", "step", "process_end"], "trainer": False}

    sidecar = subprocess.run([venv / "bin" / "nvrx-slo", "sidecar", "--help"], capture_output=True, text=True)
    assert sidecar.returncode == 2 and "pip install 'nvrx-slo[sidecar]'" in sidecar.stderr
