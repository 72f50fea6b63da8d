"""`nvrx-slo inject FILE...`: add the nvrx-slo sidecar to the training pods of Kubernetes manifests.

Reads YAML documents (files, or ``-`` for stdin) and writes them all to stdout, in order, ready for
``kubectl apply -f -``. Into every pod template of the kinds in ``CONTROLLERS`` it adds what the sidecar
needs, as written in ``sidecar_pod.yaml`` beside this module: the native sidecar, its volumes, the
journal mount and the hooks' environment on the training container, and the PodMonitor's pod label.
Every other document passes through unchanged. The repository's own overlays are made the same way
(``overlays``, run by `nvrx-slo generate deploy`), from the bare workloads in deploy/workloads/.

What it adds is kept where it already is when it is identical, so injecting twice changes nothing.
A template injected before (its init container of the sidecar's name is a native sidecar running
``sidecar``, as an earlier inject wrote it) is
upgraded in place: each of its parts that differs from this version's (the image ``--image`` names,
the sidecar's arguments, a volume's size) is replaced where it is, and each replacement is said on
stderr. In a template not injected before, a same-named container, volume, mount, env var, port or
label that is not identical is a clash, and a template whose training container cannot be told is
refused: either is an error that names the document and the reason, exit 2, nothing written.

The training container of a pod template: the one ``--container`` names, else the only container,
else (PyTorchJob) the one named ``pytorch``, which is where the training-operator runs the job.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import importlib.resources
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from nvrx_slo import file_format
from nvrx_slo.contracts import pod_env

Obj = dict[str, Any]


class InjectError(ValueError):
    """A document inject cannot handle; the message says why."""


class K8sLoader(yaml.SafeLoader):
    """YAML as Kubernetes reads it: a bare ``=`` (kustomize prints ``matchType: =``) is a string, not
    PyYAML's YAML 1.1 "value" tag, which safe_load cannot construct."""


K8sLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:value"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


# --- the controllers: where their pod templates are, and how a pod learns its job --------------------

def _field(obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise InjectError(f"no {where}")
    return obj[key]


def _job_templates(doc: Obj) -> Iterator[tuple[str, Obj]]:
    yield "spec.template", _field(_field(doc, "spec", "spec"), "template", "spec.template")


def _pytorchjob_templates(doc: Obj) -> Iterator[tuple[str, Obj]]:
    specs = _field(_field(doc, "spec", "spec"), "pytorchReplicaSpecs", "spec.pytorchReplicaSpecs")
    if not isinstance(specs, dict) or not specs:
        raise InjectError("no replica spec in spec.pytorchReplicaSpecs")
    for replica_type, replica in specs.items():
        path = f"spec.pytorchReplicaSpecs.{replica_type}.template"
        yield path, _field(replica, "template", path)


def _jobset_templates(doc: Obj) -> Iterator[tuple[str, Obj]]:
    jobs = _field(_field(doc, "spec", "spec"), "replicatedJobs", "spec.replicatedJobs")
    if not isinstance(jobs, list) or not jobs:
        raise InjectError("no replicated job in spec.replicatedJobs")
    for i, job in enumerate(jobs):
        path = f"spec.replicatedJobs[{i}].template"
        job_spec = _field(_field(job, "template", path), "spec", path + ".spec")
        yield path + ".spec.template", _field(job_spec, "template", path + ".spec.template")


@dataclass(frozen=True)
class Controller:
    """A workload kind: its pod templates, and the Downward API fields that name its job and a pod's index."""

    templates: Callable[[Obj], Iterator[tuple[str, Obj]]]
    job_name: str
    pod_index: str
    default_container: str | None = None


CONTROLLERS: dict[tuple[str, str], Controller] = {
    ("batch/v1", "Job"): Controller(
        _job_templates, "metadata.labels['batch.kubernetes.io/job-name']",
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"),
    # Master and Worker pods count their replica-index each from 0.
    ("kubeflow.org/v1", "PyTorchJob"): Controller(
        _pytorchjob_templates, "metadata.labels['training.kubeflow.org/job-name']",
        "metadata.labels['training.kubeflow.org/replica-index']", default_container="pytorch"),
    # The job is the JobSet; the index is the pod's within its child Job.
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): Controller(
        _jobset_templates, "metadata.labels['jobset.sigs.k8s.io/jobset-name']",
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"),
}


K8S_DEFAULT_GRACE_S = 30  # a pod's terminationGracePeriodSeconds when its spec sets none


# --- what the sidecar needs, for one controller -----------------------------------------------------

@dataclass(frozen=True)
class Parts:
    """Everything inject adds to one pod template."""

    labels: dict[str, str]
    grace_s: int  # the pod's terminationGracePeriodSeconds at least
    sidecar: Obj
    volumes: list[Obj]
    trainer_env: list[Obj]
    trainer_mounts: list[Obj]


def load_spec() -> Obj:
    """``sidecar_pod.yaml``: the sidecar's pod parts, less what depends on the controller."""
    text = importlib.resources.files("nvrx_slo").joinpath("sidecar_pod.yaml").read_text()
    spec: Obj = yaml.safe_load(text)
    return spec


def default_image() -> str:
    """The sidecar image tagged with this package's version."""
    return f"{load_spec()['sidecar']['image']}:{importlib.metadata.version('nvrx-slo')}"


def _downward(name: str, field_path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


def parts_for(spec: Obj, controller: Controller, image: str) -> Parts:
    sidecar = {**copy.deepcopy(spec["sidecar"]), "image": image}
    job = _downward(pod_env.JOB, controller.job_name)
    sidecar["env"] += [job, _downward("JOB_COMPLETION_INDEX", controller.pod_index)]
    trainer = copy.deepcopy(spec["trainer"])
    return Parts(labels=dict(spec["labels"]), grace_s=spec["terminationGracePeriodSeconds"], sidecar=sidecar,
                 volumes=copy.deepcopy(spec["volumes"]),
                 trainer_env=[*trainer["env"], copy.deepcopy(job)], trainer_mounts=trainer["volumeMounts"])


# --- adding them to a pod template --------------------------------------------------------------------

def _differs(theirs: Obj, ours: Obj) -> str:
    return ", ".join(sorted(k for k in theirs.keys() | ours.keys() if theirs.get(k) != ours.get(k)))


def _merge(items: list[Obj], ours: list[Obj], what: str, upgrades: list[str] | None,
           keys: tuple[str, ...] = ("name",)) -> list[Obj]:
    """``ours`` that are missing, then ``items``. One of ours already there, identical, stays where it is.
    An item sharing a key with one of ours but not identical to it is a clash, unless the template was
    injected before (``upgrades`` is a list): then ours replaces it where it is, and ``upgrades`` says so."""
    items = list(items)
    missing = []
    for mine in ours:
        same = [i for i, item in enumerate(items) if any(item.get(k) == mine[k] for k in keys)]
        if not same:
            missing.append(mine)
        elif [items[i] for i in same] != [mine]:
            theirs = next(items[i] for i in same if items[i] != mine)
            key = next(k for k in keys if theirs.get(k) == mine[k])
            if upgrades is None or len(same) > 1:
                raise InjectError(f"{what} with {key} {mine[key]!r} is already there and is not nvrx-slo's "
                                  f"(differs in: {_differs(theirs, mine)})")
            upgrades.append(f"{what} {mine[key]!r} (changed: {_differs(theirs, mine)})")
            items[same[0]] = mine
    return missing + items


def _injected_before(init_containers: list[Obj], sidecar: Obj) -> bool:
    """Whether the template has nvrx-slo's sidecar, of whatever version: a native sidecar of its name
    running the ``sidecar`` command (the image's entrypoint is ``nvrx-slo``)."""
    return any(c.get("name") == sidecar["name"] and c.get("restartPolicy") == "Always"
               and (c.get("args") or [None])[0] == sidecar["args"][0] for c in init_containers)


def training_container(containers: list[Obj], wanted: str | None, default: str | None) -> Obj:
    names = [c.get("name") for c in containers]
    if wanted is not None:
        if wanted not in names:
            raise InjectError(f"no container named {wanted!r} (--container); containers: {', '.join(map(str, names))}")
        return containers[names.index(wanted)]
    if len(containers) == 1:
        return containers[0]
    if default is not None and default in names:
        return containers[names.index(default)]
    if not containers:
        raise InjectError("no containers")
    raise InjectError(f"cannot tell the training container among {', '.join(map(str, names))}: "
                      "name it with --container")


# The extended resources a GPU device plugin advertises: what a training pod's accelerators are requested as.
ACCELERATOR_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")


def pod_accelerators(pod: Obj) -> float:
    """The accelerators the pod's containers ask for (limits, where an extended resource must be set;
    else requests): what its sidecar prices badput by, shared by the pod's ranks."""
    total = 0.0
    for container in pod.get("containers", []):
        resources = container.get("resources") or {}
        for name in ACCELERATOR_RESOURCES:
            amount = (resources.get("limits") or {}).get(name, (resources.get("requests") or {}).get(name))
            if amount is None:
                continue
            try:
                count = float(amount)
            except (TypeError, ValueError):
                raise InjectError(f"container {container.get('name')!r}: resource {name} is {amount!r}, "
                                  "not a count") from None
            if not count >= 0:
                raise InjectError(f"container {container.get('name')!r}: resource {name} is {amount!r}")
            total += count
    return total


def _sidecar_for(pod: Obj, sidecar: Obj) -> Obj:
    """The sidecar told how many accelerators its pod holds, where the template asks for any."""
    accelerators = pod_accelerators(pod)
    if not accelerators:
        return sidecar
    return {**sidecar, "args": [*sidecar["args"], f"--accelerators-per-pod={accelerators:g}"]}


def _check_ports(pod: Obj, sidecar: Obj) -> None:
    """Containers share the pod's network: the sidecar's port must be its own, and the PodMonitor
    scrapes every port of the pod with the sidecar's port name."""
    ours = sidecar["ports"]
    for container in [*pod.get("initContainers", []), *pod.get("containers", [])]:
        if container.get("name") == sidecar["name"]:
            continue
        for port in container.get("ports", []):
            for mine in ours:
                if port.get("containerPort") == mine["containerPort"] or port.get("name") == mine["name"]:
                    raise InjectError(f"container {container.get('name')!r} already declares port "
                                      f"{port.get('name') or port.get('containerPort')!r}, which the sidecar uses")


def inject_template(template: Obj, parts: Parts, container: str | None, default: str | None) -> list[str]:
    """Add ``parts`` to a pod template, in place; returns what of an earlier injection it upgraded."""
    pod = _field(template, "spec", "pod spec")
    if any(c.get("name") == parts.sidecar["name"] for c in _field(pod, "containers", "containers")):
        raise InjectError(f"container named {parts.sidecar['name']!r} is already there and is not nvrx-slo's "
                          "(a regular container, not a native sidecar)")
    trainer = training_container(pod["containers"], container, default)
    sidecar = _sidecar_for(pod, parts.sidecar)
    _check_ports(pod, sidecar)
    upgrades: list[str] | None = [] if _injected_before(pod.get("initContainers", []), sidecar) else None
    pod["initContainers"] = _merge(pod.get("initContainers", []), [sidecar], "init container", upgrades)
    pod["volumes"] = _merge(pod.get("volumes", []), parts.volumes, "volume", upgrades)
    where = f"container {trainer['name']!r}:"
    trainer["env"] = _merge(trainer.get("env", []), parts.trainer_env, f"{where} env var", upgrades)
    trainer["volumeMounts"] = _merge(trainer.get("volumeMounts", []), parts.trainer_mounts,
                                     f"{where} volume mount", upgrades, keys=("name", "mountPath"))
    grace = pod.get("terminationGracePeriodSeconds", K8S_DEFAULT_GRACE_S)
    if grace < parts.grace_s:  # the sidecar's final scrapes need it; a longer one is the user's
        if upgrades is not None and "terminationGracePeriodSeconds" in pod:
            upgrades.append(f"terminationGracePeriodSeconds ({grace} to {parts.grace_s})")
        pod["terminationGracePeriodSeconds"] = parts.grace_s
    metadata = template.setdefault("metadata", {})
    labels = metadata.setdefault("labels", {})
    for key, value in parts.labels.items():
        if labels.setdefault(key, value) == value:
            continue
        if upgrades is None:
            raise InjectError(f"pod label {key!r} is already there with value {labels[key]!r}, not {value!r}")
        upgrades.append(f"pod label {key!r} ({labels[key]!r} to {value!r})")
        labels[key] = value
    return upgrades or []


def inject_document(doc: Any, spec: Obj, image: str, container: str | None,
                    upgraded: list[str] | None = None) -> Any:
    """The document with every pod template injected, or the document itself if its kind is not ours;
    what an earlier injection had that this one upgraded is appended to ``upgraded``."""
    if not isinstance(doc, dict):
        return doc
    controller = CONTROLLERS.get((str(doc.get("apiVersion")), str(doc.get("kind"))))
    if controller is None:
        return doc
    parts = parts_for(spec, controller, image)
    out = copy.deepcopy(doc)
    for path, template in controller.templates(out):
        try:
            changes = inject_template(template, parts, container, controller.default_container)
        except InjectError as exc:
            raise InjectError(f"{path}: {exc}") from None
        if upgraded is not None:
            upgraded += [f"{path}: upgraded {change}" for change in changes]
    return out


# --- the command -------------------------------------------------------------------------------------

def _describe(doc: Any, source: str, number: int) -> str:
    what = f"{source}, document {number}"
    if isinstance(doc, dict):
        name = (doc.get("metadata") or {}).get("name", "?")
        what += f" ({doc.get('kind', '?')} {name})"
    return what


def inject_stream(sources: list[tuple[str, str]], image: str, container: str | None,
                  upgraded: list[str] | None = None) -> str:
    """Every document of every (name, text) source, injected, as one YAML stream; what it upgraded
    of an earlier injection is appended to ``upgraded``, each naming its document."""
    spec = load_spec()
    out = []
    for source, text in sources:
        try:
            docs = [d for d in yaml.load_all(text, Loader=K8sLoader) if d is not None]
        except yaml.YAMLError as exc:
            raise InjectError(f"{source}: not YAML: {exc}") from None
        for number, doc in enumerate(docs, 1):
            changes: list[str] = []
            try:
                out.append(inject_document(doc, spec, image, container, changes))
            except InjectError as exc:
                raise InjectError(f"{_describe(doc, source, number)}: {exc}") from None
            if upgraded is not None:
                upgraded += [f"{_describe(doc, source, number)}: {change}" for change in changes]
    return file_format.yaml_documents(out)


WORKLOADS = Path("deploy/workloads")  # the reference workloads as one writes them: no sidecar
OVERLAYS = Path("deploy/overlays")


def overlays(repo: Path) -> dict[Path, str]:
    """``deploy/overlays/<name>/generated/workload.yaml`` for each ``deploy/workloads/<name>.yaml`` of
    ``repo``: the workload injected, so the sidecar's pod parts are written in ``sidecar_pod.yaml``
    alone. The sidecar's image keeps its bare name, which the overlay's kustomization tags."""
    sources = sorted((repo / WORKLOADS).glob("*.yaml"))
    if not sources:
        raise InjectError(f"{repo / WORKLOADS}: no workload (*.yaml) to inject (the overlays are made in a "
                          "source checkout; for your own manifests, `nvrx-slo inject`)")
    image = load_spec()["sidecar"]["image"]
    files = {}
    for path in sources:
        source = str(WORKLOADS / path.name)
        text = inject_stream([(source, path.read_text())], image, None)
        files[OVERLAYS / path.stem / "generated" / "workload.yaml"] = (
            file_format.header("nvrx-slo generate deploy", source) + text)
    return files


def parser() -> argparse.ArgumentParser:
    """The command's flags (``tests/test_cli.py`` freezes them)."""
    kinds = ", ".join(f"{kind} ({api})" for api, kind in CONTROLLERS)
    parser = argparse.ArgumentParser(
        prog="nvrx-slo inject", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Add the nvrx-slo sidecar to every training pod template and print all documents "
                    f"to stdout (for `kubectl apply -f -`).\nKinds injected: {kinds}; "
                    "every other document passes through unchanged.")
    parser.add_argument("files", nargs="+", metavar="FILE", help="manifests to read; - reads stdin")
    parser.add_argument("--image", default=default_image(), help="the sidecar image (default: %(default)s)")
    parser.add_argument("--container", help="the training container's name in every pod template (default: the "
                                            "only container, or `pytorch` in a PyTorchJob)")
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    upgraded: list[str] = []
    try:
        sources = [(name, sys.stdin.read() if name == "-" else Path(name).read_text()) for name in args.files]
        text = inject_stream(sources, args.image, args.container, upgraded)
    except (InjectError, OSError) as exc:
        print(f"nvrx-slo inject: {exc}", file=sys.stderr)
        return 2
    for change in upgraded:
        print(f"nvrx-slo inject: {change}", file=sys.stderr)
    sys.stdout.write(text)
    return 0
