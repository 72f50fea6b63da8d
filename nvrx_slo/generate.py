"""`nvrx-slo generate WHAT`: regenerate the committed artefacts, every one from one registry.

Each entry of ``GENERATORS`` renders its files in memory from the same inputs: the SLO spec, loaded
and planned once, and this checkout's bare workloads (deploy/workloads/). Files are written only
once every generator asked for has rendered, so a bad spec or workload changes nothing on disk.
Each file is written by ``nvrx_slo.file_format`` (one dumper, one "generated — do not edit" note)
into a folder named ``generated/`` that holds nothing else; tests/test_generate.py regenerates them
all and diffs them byte for byte. Outputs Kubernetes consumes land under deploy/, so
``kubectl apply -k deploy/overlays/...`` picks them up.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nvrx_slo import inject
from nvrx_slo.alerts import files as alerts
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.spec import DEFAULT_PATH, Spec, SpecError, load
from nvrx_slo.dashboards import files as dashboards

REPO = Path(__file__).resolve().parent.parent  # a source checkout, whose deploy/workloads/ `deploy` reads


@dataclass(frozen=True)
class Inputs:
    spec: Spec
    plan: Plan
    spec_source: str  # the spec as the headers name it


def _alerts(inputs: Inputs) -> dict[Path, str]:
    return alerts.render(inputs.spec, inputs.plan, inputs.spec_source)


def _dashboards(inputs: Inputs) -> dict[Path, str]:
    return dashboards.render(inputs.spec, inputs.plan)


def _deploy(_: Inputs) -> dict[Path, str]:
    if not (REPO / inject.WORKLOADS).is_dir():  # installed from a wheel: no checkout around it
        raise inject.InjectError(f"`deploy` (and `all`) makes this project's own overlays from {inject.WORKLOADS}/ "
                                 "of a source checkout of nvrx-slo, not of an installed package; for your own "
                                 "manifests, `nvrx-slo inject`")
    return inject.overlays(REPO)


# name -> its files (path relative to the output root -> text)
GENERATORS: dict[str, Callable[[Inputs], dict[Path, str]]] = {
    "alerts": _alerts,  # rule files (one Prometheus, and two tiers), Alertmanager config, their CRDs
    "dashboards": _dashboards,  # Grafana JSON and its ConfigMaps
    "deploy": _deploy,  # the overlays' workloads, the sidecar injected
}


def render(names: list[str], inputs: Inputs) -> dict[Path, str]:
    """The files of the generators ``names``, in their order."""
    return {path: text for name in names for path, text in GENERATORS[name](inputs).items()}


def parser() -> argparse.ArgumentParser:
    """The command's flags (``tests/test_cli.py`` freezes them)."""
    parser = argparse.ArgumentParser(prog="nvrx-slo generate", description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=[*GENERATORS, "all"], help="which artefacts to regenerate")
    parser.add_argument("--spec", type=Path, default=DEFAULT_PATH,
                        help="the SLO spec the rules and dashboards come from (default: alerts/slo.yaml)")
    parser.add_argument("--root", type=Path, default=Path("."), help="write under this directory (default: .)")
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    names = list(GENERATORS) if args.what == "all" else [args.what]
    source = "alerts/slo.yaml" if args.spec == DEFAULT_PATH else str(args.spec)
    try:
        spec = load(args.spec)
        files = render(names, Inputs(spec, spec.plan(), source))
    except (SpecError, inject.InjectError, OSError) as err:
        print(f"nvrx-slo generate: {err}", file=sys.stderr)
        return 2
    for path, text in files.items():
        target = args.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        print(target)
    return 0
