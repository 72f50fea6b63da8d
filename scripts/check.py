"""The gate before the tests: ruff over the repository, then mypy over the package as it installs.

mypy finds modules by folder, but the rooms install under ``nvrx_slo`` through setuptools'
``package-dir`` mapping (``trainer/`` is ``nvrx_slo.trainer``), which it cannot read. So the
installed layout is laid out as links in ``build/typecheck/`` — from pyproject.toml's own
mapping — and mypy runs there; its paths read ``nvrx_slo/trainer/hooks.py`` for ``trainer/hooks.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
BIN = Path(sys.executable).parent


def link_tree() -> None:
    """``TREE/nvrx_slo`` with every entry of ``nvrx_slo/`` and each mapped room linked in."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.rmtree(TREE, ignore_errors=True)
    package = TREE / "nvrx_slo"
    package.mkdir(parents=True)
    for entry in (ROOT / "nvrx_slo").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for module, folder in mapping.items():
        (TREE / module.replace(".", "/")).symlink_to(ROOT / folder)


def main() -> int:
    ruff = subprocess.run([BIN / "ruff", "check", "."], cwd=ROOT)
    link_tree()
    mypy = subprocess.run([BIN / "mypy", "--config-file", ROOT / "pyproject.toml", "-p", "nvrx_slo"], cwd=TREE,
                          env={**os.environ, "MYPY_CACHE_DIR": str(ROOT / ".mypy_cache")})
    return ruff.returncode or mypy.returncode


if __name__ == "__main__":
    raise SystemExit(main())
