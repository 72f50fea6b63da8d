"""`nvrx-slo generate dashboards`: write the dashboards as Grafana JSON and as ConfigMaps.

The SLO spec (``alerts/slo.yaml``, the one the alert rules come from) sets the objectives and
thresholds the panels draw, so a dashboard's lines are the alerts' lines.

Outputs (committed; a test regenerates them and fails on any difference):

* ``dashboards/generated/<uid>.json`` — import in Grafana's UI (Dashboards → New → Import);
* ``deploy/base/generated/grafana-dashboards.yaml`` — one ConfigMap per dashboard, labelled
  ``grafana_dashboard: "1"`` so kube-prometheus-stack's Grafana sidecar loads it. Each stays
  under 256 KiB, the limit of ``kubectl apply``'s last-applied annotation; generation fails
  rather than write a bigger one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from nvrx_slo import generated
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.spec import DEFAULT_PATH, Spec, SpecError, load
from nvrx_slo.dashboards import checkpointing, overview, ranks, recovery

REPO_ROOT = Path(__file__).resolve().parent.parent
JSON_DIR = Path("dashboards/generated")
CONFIGMAPS = Path("deploy/base/generated/grafana-dashboards.yaml")
CONFIGMAP_LIMIT_BYTES = 256 * 1024
DASHBOARD_LABEL = {"grafana_dashboard": "1"}  # kube-prometheus-stack's sidecar convention
COMMAND = "nvrx-slo generate dashboards"
MODULES = (overview, checkpointing, recovery, ranks)


def dashboards(spec: Spec, plan: Plan) -> list[g.Dashboard]:
    return [module.dashboard(spec, plan) for module in MODULES]


def to_json(dashboard: g.Dashboard) -> str:
    return generated.json_document(dashboard.to_json_data(), DashboardEncoder)


def to_configmaps(rendered: dict[str, str]) -> str:
    """One ConfigMap per dashboard (``uid -> JSON``), as one multi-document YAML file."""
    docs = []
    for uid, text in rendered.items():
        doc = {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": f"{uid}-dashboard",
                            "labels": {**DASHBOARD_LABEL, "app.kubernetes.io/part-of": "nvrx-slo"}},
               "data": {f"{uid}.json": text}}
        size = len(generated.yaml_document(doc).encode())
        if size >= CONFIGMAP_LIMIT_BYTES:
            raise ValueError(f"ConfigMap for {uid} is {size} bytes, over {CONFIGMAP_LIMIT_BYTES}: "
                             "split the dashboard or document server-side apply")
        docs.append(doc)
    return generated.header(COMMAND, "dashboards/") + generated.yaml_documents(docs)


def render(spec: Spec, plan: Plan) -> dict[Path, str]:
    """Every generated file: path relative to the repository root -> content."""
    rendered = {d.uid: to_json(d) for d in dashboards(spec, plan)}
    files = {JSON_DIR / f"{uid}.json": text for uid, text in rendered.items()}
    files[CONFIGMAPS] = to_configmaps(rendered)
    return files


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nvrx-slo generate dashboards", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=DEFAULT_PATH,
                        help="SLO spec whose objectives and thresholds the panels draw (default: alerts/slo.yaml)")
    parser.add_argument("--root", type=Path, default=Path("."), help="write under this directory (default: .)")
    args = parser.parse_args(argv)
    try:
        spec = load(args.spec)
    except SpecError as err:
        print(f"nvrx-slo generate dashboards: {err}", file=sys.stderr)
        return 2
    for rel, text in render(spec, spec.plan()).items():
        path = args.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(path)
    return 0
