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
    assert result == {"types": ["process_start", "step_timing", "step", "process_end"], "trainer": False}

    sidecar = subprocess.run([venv / "bin" / "nvrx-slo", "sidecar", "--help"], capture_output=True, text=True)
    assert sidecar.returncode == 2 and "pip install 'nvrx-slo[sidecar]'" in sidecar.stderr


@pytest.mark.slow
def test_generate_runs_from_the_wheel_in_a_fresh_venv_outside_the_checkout(wheel, tmp_path):
    """A user with their own SLO spec: ``pip install 'nvrx-slo[generate]'`` into a new venv, then
    ``nvrx-slo generate alerts|dashboards --spec my-slo.yaml --root DIR`` anywhere writes what the
    checkout writes for that spec; ``deploy`` and ``all`` (this project's own overlays) say in one
    line that they need a checkout, and write nothing."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    subprocess.run([venv / "bin" / "pip", "install", "--quiet", f"{wheel}[generate]"], check=True, timeout=240)
    spec = (ROOT / "alerts" / "slo.yaml").read_text().replace("period: 30d", "period: 7d")
    assert "period: 7d" in spec
    work = tmp_path / "elsewhere"
    work.mkdir()
    (work / "my-slo.yaml").write_text(spec)

    def generate(nvrx_slo: Path, what: str, root: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([nvrx_slo, "generate", what, "--spec", "my-slo.yaml", "--root", root], cwd=work,
                              capture_output=True, text=True, timeout=120)

    for what in ("alerts", "dashboards"):
        from_wheel, from_checkout = generate(venv / "bin" / "nvrx-slo", what, "wheel"), generate(
            Path(sys.executable).with_name("nvrx-slo"), what, "checkout")
        assert from_wheel.returncode == 0 == from_checkout.returncode, from_wheel.stderr
        written = sorted(p.relative_to(work / "wheel") for p in (work / "wheel").rglob("*") if p.is_file())
        assert written and written == sorted(p.relative_to(work / "checkout")
                                             for p in (work / "checkout").rglob("*") if p.is_file())
        for path in written:
            assert (work / "wheel" / path).read_text() == (work / "checkout" / path).read_text(), path
        shutil.rmtree(work / "wheel")
        shutil.rmtree(work / "checkout")
    for what in ("deploy", "all"):
        done = generate(venv / "bin" / "nvrx-slo", what, "out")
        assert done.returncode == 2 and done.stdout == "" and not (work / "out").exists()
        assert len(done.stderr.splitlines()) == 1 and "source checkout" in done.stderr, done.stderr
