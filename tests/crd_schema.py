"""Custom resources against their CRDs' schemas (tests/crds/), strict about unknown fields.

The API server prunes a field its structural schema does not name (unless the schema says
``x-kubernetes-preserve-unknown-fields``), so a misspelt field is dropped without a word. Here every
object schema with ``properties`` gets ``additionalProperties: false`` instead, so it fails the test.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from nvrx_slo.inject import K8sLoader

CRDS = Path(__file__).resolve().parent / "crds"


def strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of an openAPIV3Schema that rejects fields it does not name."""
    schema = copy.deepcopy(schema)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node \
                    and not node.get("x-kubernetes-preserve-unknown-fields"):
                node["additionalProperties"] = False
            if "(?i)" in node.get("pattern", "")[1:]:  # Go's RE2 takes flags anywhere, Python at the start only
                node["pattern"] = "(?i)" + node["pattern"].replace("(?i)", "")
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@cache
def schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the strict schema, for every version of every CRD file."""
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=K8sLoader)  # enum values such as a bare =
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            out[(f"{group}/{version['name']}", kind)] = strict(version["schema"]["openAPIV3Schema"])
    return out


def _routes(route: dict[str, Any]) -> list[dict[str, Any]]:
    children = route.get("routes", [])
    return children + [r for child in children for r in _routes(child)]


def validate(doc: dict[str, Any], k8s_version: str) -> None:
    """Raise ``jsonschema.ValidationError`` (or kubernetes-validate's) if ``doc`` breaks its CRD.

    The parts the vendored CRDs leave open are checked with the core schemas: child routes as routes
    (the operator parses them so), a PyTorchJob replica's pod template as a PodTemplateSpec, a JobSet
    replicated job's template as a Job.
    """
    schema = schemas()[(doc["apiVersion"], doc["kind"])]
    jsonschema.validate(doc, schema)
    if doc["kind"] == "AlertmanagerConfig" and "route" in doc["spec"]:
        route_schema = schema["properties"]["spec"]["properties"]["route"]
        for child in _routes(doc["spec"]["route"]):
            jsonschema.validate(child, route_schema)
    if doc["kind"] == "PyTorchJob":
        for name, replica in doc["spec"]["pytorchReplicaSpecs"].items():
            kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name},
                                          "template": replica["template"]}, k8s_version, strict=True)
    if doc["kind"] == "JobSet":
        for job in doc["spec"]["replicatedJobs"]:
            kubernetes_validate.validate({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job["name"]},
                                          "spec": job["template"]["spec"]}, k8s_version, strict=True)
