"""`nvrx-slo generate dashboards` (``nvrx_slo/generate.py``): the dashboards as Grafana JSON and as ConfigMaps.

The SLO spec (``alerts/slo.yaml``, the one the alert rules come from) sets the objectives and
thresholds the panels draw, so a dashboard's lines are the alerts' lines.

Outputs (committed, and drift-tested with every generated file):

* ``dashboards/generated/<uid>.json`` — import in Grafana's UI (Dashboards → New → Import);
* ``deploy/base/generated/grafana-dashboards.yaml`` — one ConfigMap per dashboard, labelled
  ``grafana_dashboard: "1"`` so kube-prometheus-stack's Grafana sidecar loads it. Each stays
  under 256 KiB, the limit of ``kubectl apply``'s last-applied annotation; generation fails
  rather than write a bigger one.
"""

from __future__ import annotations

from pathlib import Path

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from nvrx_slo import file_format
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.spec import Spec
from nvrx_slo.dashboards import checkpointing, fleet, overview, ranks, recovery

JSON_DIR = Path("dashboards/generated")
CONFIGMAPS = Path("deploy/base/generated/grafana-dashboards.yaml")
CONFIGMAP_LIMIT_BYTES = 256 * 1024
DASHBOARD_LABEL = {"grafana_dashboard": "1"}  # kube-prometheus-stack's sidecar convention
COMMAND = "nvrx-slo generate dashboards"
MODULES = (overview, checkpointing, recovery, ranks, fleet)


def dashboards(spec: Spec, plan: Plan) -> list[g.Dashboard]:
    return [module.dashboard(spec, plan) for module in MODULES]


def to_json(dashboard: g.Dashboard) -> str:
    return file_format.json_document(dashboard.to_json_data(), DashboardEncoder)


def to_configmaps(rendered: dict[str, str]) -> str:
    """One ConfigMap per dashboard (``uid -> JSON``), as one multi-document YAML file."""
    docs = []
    for uid, text in rendered.items():
        doc = {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": f"{uid}-dashboard",
                            "labels": {**DASHBOARD_LABEL, "app.kubernetes.io/part-of": "nvrx-slo"}},
               "data": {f"{uid}.json": text}}
        size = len(file_format.yaml_document(doc).encode())
        if size >= CONFIGMAP_LIMIT_BYTES:
            raise ValueError(f"ConfigMap for {uid} is {size} bytes, over {CONFIGMAP_LIMIT_BYTES}: "
                             "split the dashboard or document server-side apply")
        docs.append(doc)
    return file_format.header(COMMAND, "dashboards/") + file_format.yaml_documents(docs)


def render(spec: Spec, plan: Plan) -> dict[Path, str]:
    """Every generated file: path relative to the repository root -> content."""
    rendered = {d.uid: to_json(d) for d in dashboards(spec, plan)}
    files = {JSON_DIR / f"{uid}.json": text for uid, text in rendered.items()}
    files[CONFIGMAPS] = to_configmaps(rendered)
    return files
