"""`nvrx-slo generate WHAT`: regenerate committed artefacts (each file headed "generated — do not edit").

Each generator is a `main(argv) -> int` in its own room, imported lazily. Outputs that Kubernetes
consumes land in `deploy/base/generated/`, so `kubectl apply -k deploy/...` picks them up.
"""

from __future__ import annotations

import argparse
import importlib

GENERATORS: dict[str, str] = {
    "alerts": "nvrx_slo.alerts.generate:main",
    "dashboards": "nvrx_slo.dashboards.generate:main",
}


def parser() -> argparse.ArgumentParser:
    """The command's flags (``tests/test_cli.py`` freezes them)."""
    parser = argparse.ArgumentParser(prog="nvrx-slo generate", description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=[*GENERATORS, "all"], help="which artefacts to regenerate")
    # every generator takes both; given here, before or after WHAT, and handed on
    parser.add_argument("--spec", help="the SLO spec the rules and dashboards come from (default: alerts/slo.yaml)")
    parser.add_argument("--root", help="write under this directory (default: .)")
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    rest = [arg for flag in ("spec", "root") if getattr(args, flag) is not None
            for arg in (f"--{flag}", getattr(args, flag))]
    names = list(GENERATORS) if args.what == "all" else [args.what]
    for name in names:
        module_name, func_name = GENERATORS[name].split(":")
        code = int(getattr(importlib.import_module(module_name), func_name)(rest) or 0)
        if code:
            return code
    return 0
