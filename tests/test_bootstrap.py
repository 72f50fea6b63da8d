"""``scripts/bootstrap.sh`` picks where torch comes from: PyTorch's CPU wheel index where no NVIDIA
GPU is present (PyPI's x86_64 torch is the CUDA build, several GB), the default index if that one
cannot serve it, and the default index on a GPU machine.

The script runs for real in a copy of the repository's two files it reads; ``.venv/bin/pip`` is a
stand-in that logs its arguments (and fails where told to), and ``nvidia-smi`` on ``PATH`` is a
GPU or nothing. Installing for real needs the network: this machine reaches PyPI but not
download.pytorch.org, where the script's CPU path then takes pip's configured local CPU wheel.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"

PIP = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../pip.log"
case "$*" in *"--index-url"*) [ -z "$FAIL_CPU_INDEX" ] ;; *) true ;; esac
"""


def bootstrap(tmp: Path, *, gpu: bool, cpu_index_fails: bool = False) -> list[str]:
    """Run the script in a copy; the pip calls it made, in order."""
    (tmp / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "bootstrap.sh", tmp / "scripts")
    shutil.copy(ROOT / "pyproject.toml", tmp)
    venv = tmp / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    (venv / "pip").write_text(PIP)
    (venv / "pip").chmod(0o755)
    tools = tmp / "tools"
    tools.mkdir()
    if gpu:
        (tools / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100'\n")
        (tools / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{tools}:/usr/bin:/bin", "PYTHON": sys.executable}
    if cpu_index_fails:
        env["FAIL_CPU_INDEX"] = "1"
    done = subprocess.run(["bash", "scripts/bootstrap.sh"], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return (tmp / ".venv" / "pip.log").read_text().splitlines()


@pytest.mark.skipif(Path("/proc/driver/nvidia/gpus").exists(), reason="this machine has an NVIDIA GPU")
def test_without_a_gpu_torch_comes_from_the_cpu_wheel_index_first(tmp_path):
    calls = bootstrap(tmp_path, gpu=False)
    torch = [c for c in calls if "torch==2.13.0" in c]
    assert torch == [f"install -q --index-url {CPU_INDEX} --timeout 10 --retries 1 torch==2.13.0"]
    assert calls.index(torch[0]) < next(i for i, c in enumerate(calls) if "-e .[" in c)  # before anything needing it


@pytest.mark.skipif(Path("/proc/driver/nvidia/gpus").exists(), reason="this machine has an NVIDIA GPU")
def test_an_unreachable_cpu_index_falls_back_to_the_default_one(tmp_path):
    calls = bootstrap(tmp_path, gpu=False, cpu_index_fails=True)
    assert [c for c in calls if "torch==2.13.0" in c] == [
        f"install -q --index-url {CPU_INDEX} --timeout 10 --retries 1 torch==2.13.0", "install -q torch==2.13.0"]


def test_with_a_gpu_torch_comes_from_the_default_index(tmp_path):
    calls = bootstrap(tmp_path, gpu=True)
    assert [c for c in calls if "torch==2.13.0" in c] == ["install -q torch==2.13.0"]
