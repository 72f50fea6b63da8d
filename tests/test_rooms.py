"""Import boundaries between the rooms (ARCHITECTURE.md, "Rooms"), read from the source.

Every ``import`` statement counts, including those inside functions (the lazy ones are exactly the
ones a runtime check would miss). A room that needs another's types takes them from
``nvrx_slo.contracts``, which needs nothing but the standard library so that the base install
carries it.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What dashboards may read of the alerts room: the spec, its plan, the names the rules record and the
# durations they are written in; never a rule builder, so rewriting a rule moves no panel.
_RULE_BUILDERS = tuple(f"nvrx_slo.alerts.{p.stem}" for p in sorted((ROOT / "alerts").glob("*.py"))
                       if p.stem not in {"__init__", "spec", "plan", "conventions", "duration"})

FORBIDDEN: dict[str, tuple[str, ...]] = {
    # The sidecar image stays small and ships no trainer code.
    "exporter": ("nvrx_slo.trainer", "torch", "nvidia_resiliency_ext", "nvrx_slo.alerts", "nvrx_slo.dashboards"),
    # Training processes import no sidecar, generation or view code.
    "trainer": ("nvrx_slo.exporter", "nvrx_slo.alerts", "nvrx_slo.dashboards"),
    # Rules and dashboards query metrics by the catalogue's names, never the exporter that emits them.
    "alerts": ("nvrx_slo.exporter", "nvrx_slo.trainer", "nvrx_slo.dashboards"),
    "dashboards": ("nvrx_slo.exporter", "nvrx_slo.trainer", *_RULE_BUILDERS),
}


def imports(path: Path) -> set[str]:
    """Every module an ``import`` or ``from … import`` in ``path`` names (all absolute: relative ones fail)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            found |= {node.module or ""} | {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def offending(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_a_room_imports_nothing_it_may_not(room):
    bad = {f"{path.relative_to(ROOT)}: {module}" for path in sorted((ROOT / room).rglob("*.py"))
           for module in imports(path) if offending(module, FORBIDDEN[room])}
    assert not bad


def test_the_contracts_need_only_the_standard_library():
    paths = sorted((ROOT / "nvrx_slo" / "contracts").rglob("*.py"))
    assert paths
    outside = {f"{path.name}: {module}" for path in paths for module in imports(path)
               if module.split(".")[0] not in sys.stdlib_module_names | {"__future__", "nvrx_slo"}
               or (module.startswith("nvrx_slo.") and not module.startswith("nvrx_slo.contracts"))}
    assert not outside


_TOP = tuple(f"nvrx_slo.exporter.{m}" for m in ("live", "sidecar", "flags", "server", "state_store"))
_OFFLINE = "nvrx_slo.exporter.offline"
LAYERS = {  # inside the sidecar, one way: ingest -> engine -> views, and the process or the offline room on top
    "ingest": ("nvrx_slo.exporter.engine", "nvrx_slo.exporter.views", _OFFLINE, *_TOP),
    # the engine reads events (``exporter/events.py``), never the reader that makes them
    "engine": ("nvrx_slo.exporter.ingest", "nvrx_slo.exporter.views", _OFFLINE, *_TOP),
    # a view renders a View: it reads no journal and knows no process
    "views": ("nvrx_slo.exporter.ingest", _OFFLINE, *_TOP),
    # a journal read after the fact: the reader, the engine and the views, never the sidecar process
    "offline": _TOP,
}
# Plain helpers every layer may use: they use none.
NEUTRAL = ("events", "identity", "printable")


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_an_exporter_layer_imports_nothing_above_it(layer):
    paths = sorted((ROOT / "exporter" / layer).rglob("*.py"))
    assert paths
    bad = {f"{path.relative_to(ROOT)}: {module}" for path in paths
           for module in imports(path) if offending(module, LAYERS[layer])}
    assert not bad


@pytest.mark.parametrize("module", NEUTRAL)
def test_the_exporters_plain_helpers_import_no_layer(module):
    layers = tuple(f"nvrx_slo.exporter.{m}" for m in (*LAYERS, *(t.rsplit(".", 1)[1] for t in _TOP)))
    assert not {m for m in imports(ROOT / "exporter" / f"{module}.py") if offending(m, layers)}


def test_the_boundaries_are_checked_against_real_imports():
    """A scan that found nothing because it read nothing would pass too: make sure it reads."""
    assert "nvrx_slo.contracts.schema" in set().union(*(imports(p) for p in (ROOT / "exporter").rglob("*.py")))
    assert "nvrx_slo.contracts.catalogue" in set().union(*(imports(p) for p in (ROOT / "alerts").glob("*.py")))


def test_nothing_imports_a_room_by_its_folder_name():
    """``trainer.hooks`` resolves from the repository root (the folder is on the path) but from no
    install: every import goes through ``nvrx_slo``."""
    rooms = ("trainer", "exporter", "alerts", "dashboards")
    paths = [p for top in ("nvrx_slo", *rooms, "tests", "bench") for p in sorted((ROOT / top).rglob("*.py"))]
    bare = {f"{path.relative_to(ROOT)}: {module}" for path in paths for module in imports(path)
            if module.split(".")[0] in rooms}
    assert not bare
