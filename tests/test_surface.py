"""The supported surface: what ``import nvrx_slo`` gives, what it costs, and that the docs show exactly it.

``nvrx_slo.__all__`` is the surface; each name is defined under that name in a module at
``trainer/``'s top level, which never imports the reference job's code (``trainer/reference/``).
Every expectation is read from the code, the folders and the docs, none written down here.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import nvrx_slo

ROOT = Path(__file__).resolve().parent.parent
SUPPORTED = sorted(p for p in (ROOT / "trainer").glob("*.py") if p.stem != "__init__")
REFERENCE = "nvrx_slo.trainer.reference"


def loaded_by(code: str) -> list[str]:
    """The modules a fresh interpreter loads while it runs ``code``, beyond those it started with."""
    script = ("import json, sys\nbefore = set(sys.modules)\n" + code
              + "\nprint(json.dumps(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def outside_stdlib(modules: list[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] not in sys.stdlib_module_names}


def test_import_nvrx_slo_reads_the_package_file_and_nothing_of_ours_or_anyone_elses():
    assert outside_stdlib(loaded_by("import nvrx_slo")) == {"nvrx_slo"}


def test_every_name_of_the_surface_costs_the_standard_library_and_our_supported_modules_only():
    loaded = loaded_by("import nvrx_slo\nfor name in nvrx_slo.__all__:\n    getattr(nvrx_slo, name)")
    ours = {m for m in outside_stdlib(loaded) if m == "nvrx_slo" or m.startswith("nvrx_slo.")}
    assert outside_stdlib(loaded) == ours  # no torch, NVRx, msgspec, ...
    supported = {f"nvrx_slo.trainer.{p.stem}" for p in SUPPORTED}
    assert {m for m in ours if m.startswith("nvrx_slo.trainer.")} <= supported
    assert not {m for m in ours if m == REFERENCE or m.startswith(REFERENCE + ".")}


def test_each_name_is_defined_under_that_name_in_a_supported_module_and_is_the_same_object_there():
    supported = {f"nvrx_slo.trainer.{p.stem}" for p in SUPPORTED}
    for name in nvrx_slo.__all__:
        value = getattr(nvrx_slo, name)
        assert value.__name__ == name and value.__module__ in supported, (name, value)
        assert getattr(sys.modules[value.__module__], name) is value  # the full path keeps working


def _type_checking_names() -> set[str]:
    """The names ``nvrx_slo/__init__.py`` imports under ``if TYPE_CHECKING:``: what mypy sees."""
    tree = ast.parse((ROOT / "nvrx_slo" / "__init__.py").read_text())
    blocks = [n for n in tree.body if isinstance(n, ast.If) and isinstance(n.test, ast.Name)
              and n.test.id == "TYPE_CHECKING"]
    return {alias.asname or alias.name for block in blocks for n in block.body if isinstance(n, ast.ImportFrom)
            for alias in n.names}


def test_mypy_sees_every_name_of_the_surface():
    """The lazy ``__getattr__`` is hidden from mypy (a misspelt name stays an error), so a name
    missing from the TYPE_CHECKING imports would type-check nowhere in a user's script."""
    assert _type_checking_names() == set(nvrx_slo.__all__)


_FROM_IMPORT = re.compile(r"from nvrx_slo import ([\w, ]+)")
_ATTRIBUTE = re.compile(r"\bnvrx_slo\.(\w+)(?![\w.])")


def documented_names() -> set[str]:
    """What the README and docs/ use of ``nvrx_slo`` itself: ``from nvrx_slo import X`` and
    ``nvrx_slo.X``, leaving out the package's submodules (``nvrx_slo.contracts``)."""
    names: set[str] = set()
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = page.read_text()
        names |= {n.strip() for m in _FROM_IMPORT.finditer(text) for n in m.group(1).split(",") if n.strip()}
        names |= {m.group(1) for m in _ATTRIBUTE.finditer(text)}
    return {n for n in names if importlib.util.find_spec(f"nvrx_slo.{n}") is None}


def test_the_docs_show_exactly_the_surface():
    assert "Hooks" in documented_names()  # the README's first snippet: the scan reads the pages
    assert documented_names() == set(nvrx_slo.__all__)


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    return ({n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
            | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names})


def test_no_supported_module_imports_the_reference_code():
    """Every import statement, the lazy ones inside functions included."""
    found = {path.name: _imported(path) for path in [*SUPPORTED, ROOT / "nvrx_slo" / "__init__.py"]}
    assert "nvrx_slo.trainer.journal" in found["hooks.py"]  # the scan reads imports
    assert not {f"{name}: {m}" for name, modules in found.items() for m in modules
                if m == REFERENCE or m.startswith(REFERENCE + ".")}
