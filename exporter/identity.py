"""Who the sidecar speaks for: the pod's Kubernetes identity, from the Downward API.

Read once at start-up from the environment and, for what env cannot carry, from files:

============== ===================================== =============================================
field          env (Downward API ``fieldRef``)       else
============== ===================================== =============================================
namespace      ``POD_NAMESPACE``                     the service account's ``namespace`` file
pod            ``POD_NAME``                          ``HOSTNAME`` (Kubernetes sets it to the pod
                                                     name), then the host name (``pod_env``)
node           ``NODE_NAME``                         ""
job_name       ``NVRX_SLO_JOB`` (shared with the     label ``batch.kubernetes.io/job-name`` (or
               trainer)                              ``job-name``) in ``<podinfo>/labels``
replica_index  ``JOB_COMPLETION_INDEX`` (set by an   label ``batch.kubernetes.io/job-completion-index``
               Indexed Job)
============== ===================================== =============================================

``<podinfo>`` is a Downward API volume (``--podinfo-dir``, e.g. ``/etc/podinfo``) whose
``labels`` item holds ``metadata.labels``. Outside Kubernetes the fields are empty, except pod.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nvrx_slo.contracts import pod_env

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
COMPLETION_INDEX_LABELS = ("batch.kubernetes.io/job-completion-index",)


@dataclass(frozen=True)
class PodIdentity:
    namespace: str
    pod: str
    node: str
    job_name: str
    replica_index: int | None = None

    def resource_attributes(self) -> dict[str, str | int]:
        """OpenTelemetry resource attributes (k8s semantic conventions); empty fields left out."""
        attrs: dict[str, str | int] = {
            "k8s.namespace.name": self.namespace,
            "k8s.pod.name": self.pod,
            "k8s.node.name": self.node,
            "k8s.job.name": self.job_name,
        }
        if self.replica_index is not None:
            attrs["k8s.job.completion_index"] = self.replica_index
        return {k: v for k, v in attrs.items() if v != ""}


def parse_labels_file(text: str) -> dict[str, str]:
    """The Downward API ``labels`` file: one ``key="value"`` per line, values Go-quoted."""
    labels = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        try:
            labels[key.strip()] = str(json.loads(value))
        except ValueError:
            labels[key.strip()] = value.strip().strip('"')
    return labels


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _index(value: str) -> int | None:
    return int(value) if value.strip().isdigit() else None


def from_environment(env: Mapping[str, str] | None = None, podinfo_dir: Path | None = None,
                     service_account_namespace: Path = SERVICE_ACCOUNT_NAMESPACE) -> PodIdentity:
    env = os.environ if env is None else env
    labels = parse_labels_file(_read(podinfo_dir / "labels")) if podinfo_dir is not None else {}

    def label(names: tuple[str, ...]) -> str:
        return next((labels[n] for n in names if n in labels), "")

    return PodIdentity(
        namespace=env.get("POD_NAMESPACE") or _read(service_account_namespace),
        pod=pod_env.pod(env),
        node=pod_env.node(env),
        job_name=pod_env.job(env) or label(JOB_NAME_LABELS),
        replica_index=_index(env.get("JOB_COMPLETION_INDEX", "")) if env.get("JOB_COMPLETION_INDEX")
        else _index(label(COMPLETION_INDEX_LABELS)),
    )
