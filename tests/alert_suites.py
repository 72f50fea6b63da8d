"""The promtool unit-test suites (tests/promtool/<spec>/*.yaml) and the spec each folder stands for: the
default ``alerts/slo.yaml`` with the top-level keys of the folder's ``overrides.yaml``, if it has one."""

from __future__ import annotations

from pathlib import Path

import yaml

from nvrx_slo.alerts import spec

SUITES = Path(__file__).parent / "promtool"
OVERRIDES = "overrides.yaml"


def suites() -> list[Path]:
    return sorted(p for p in SUITES.glob("*/*.yaml") if p.name != OVERRIDES)


def spec_for(folder: Path) -> spec.Spec:
    data = yaml.safe_load(spec.DEFAULT_PATH.read_text())
    overrides = folder / OVERRIDES
    if overrides.exists():
        data.update(yaml.safe_load(overrides.read_text()))
    return spec.from_dict(data)
