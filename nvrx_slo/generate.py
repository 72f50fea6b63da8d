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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nvrx-slo generate", description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=[*GENERATORS, "all"], help="which artefacts to regenerate")
    args, rest = parser.parse_known_args(argv)
    names = list(GENERATORS) if args.what == "all" else [args.what]
    for name in names:
        module_name, func_name = GENERATORS[name].split(":")
        code = int(getattr(importlib.import_module(module_name), func_name)(rest) or 0)
        if code:
            return code
    return 0
