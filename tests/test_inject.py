"""`nvrx-slo inject`: real-world-shaped manifests in (tests/manifests/), strictly valid manifests out.

What inject adds is checked against the facts it must get right, written out here rather than read back
from inject: the Downward API field that names each controller's job, the sidecar's shape, the journal
shared by both containers. That everything else is unchanged is checked by taking inject's parts back
out and comparing with the input. Built-in kinds are validated with kubernetes-validate --strict, custom
resources against their CRDs (tests/crd_schema.py).
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import crd_schema
from deploy_model import K8S_VERSIONS, OVERLAYS, ROOT, SIDECAR
from nvrx_slo import inject
from nvrx_slo.contracts import pod_env, schema

MANIFESTS = ROOT / "tests" / "manifests"
CASES = ("aws-indexed-job.yaml", "pytorchjob.yaml", "jobset.yaml")
OUR_VOLUMES = {"journal", "sidecar-state", "sidecar-api-token"}
OUR_TRAINER_ENV = {schema.JOURNAL_DIR_ENV, pod_env.POD, pod_env.NODE, pod_env.JOB}
GRACE_S = 45  # the pod's grace period inject raises a shorter one to
MONITOR_LABEL = ("nvrx-slo/monitor", "true")  # what deploy/base/podmonitor.yaml selects
JOB_NAME_FIELD = {  # how each controller's pods learn their job's name (the controllers' documented labels)
    "Job": "metadata.labels['batch.kubernetes.io/job-name']",
    "PyTorchJob": "metadata.labels['training.kubeflow.org/job-name']",
    "JobSet": "metadata.labels['jobset.sigs.k8s.io/jobset-name']",
}
TRAINER = {"Job": {"spec.template": "pytorch"},
           "PyTorchJob": {"Master": "pytorch", "Worker": "pytorch"},
           "JobSet": {"driver": "driver", "workers": "trainer"}}


def load(text: str) -> list[Any]:
    return [d for d in yaml.load_all(text, Loader=inject.K8sLoader) if d is not None]


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The real command, as a user runs it."""
    exe = Path(sys.executable).parent / "nvrx-slo"
    return subprocess.run([str(exe), "inject", *args], input=stdin, capture_output=True, text=True, timeout=60)


def inject_files(*paths: Path, **flags: str) -> str:
    sources = [(str(p), p.read_text()) for p in paths]
    return inject.inject_stream(sources, flags.get("image", "nvrx-slo-sidecar:9.9"), flags.get("container"))


def templates(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A workload's pod templates by replica (the test's own walk, not inject's)."""
    if doc["kind"] == "Job":
        return {"spec.template": doc["spec"]["template"]}
    if doc["kind"] == "PyTorchJob":
        return {name: r["template"] for name, r in doc["spec"]["pytorchReplicaSpecs"].items()}
    return {j["name"]: j["template"]["spec"]["template"] for j in doc["spec"]["replicatedJobs"]}


def named(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (item,) = [i for i in items if i["name"] == name]
    return item


def strip(doc: dict[str, Any]) -> dict[str, Any]:
    """An injected workload with inject's parts taken back out."""
    doc = copy.deepcopy(doc)
    for replica, template in templates(doc).items():
        spec = template["spec"]
        spec["initContainers"] = [c for c in spec["initContainers"] if c["name"] != SIDECAR]
        if spec["terminationGracePeriodSeconds"] == GRACE_S:  # the inputs set none (30 s)
            del spec["terminationGracePeriodSeconds"]
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in OUR_VOLUMES]
        trainer = named(spec["containers"], TRAINER[doc["kind"]][replica])
        trainer["env"] = [e for e in trainer["env"] if e["name"] not in OUR_TRAINER_ENV]
        trainer["volumeMounts"] = [m for m in trainer["volumeMounts"] if m["name"] != "journal"]
        for key in ("initContainers", "volumes"):
            if not spec[key]:
                del spec[key]
        for key in ("env", "volumeMounts"):
            if not trainer[key]:
                del trainer[key]
        labels = template["metadata"]["labels"]
        del labels[MONITOR_LABEL[0]]
        if not labels:
            del template["metadata"]["labels"]
        if not template["metadata"]:
            del template["metadata"]
    return doc


@pytest.fixture(scope="module", params=CASES)
def case(request: pytest.FixtureRequest) -> tuple[list[Any], list[Any]]:
    """(input documents, injected documents) of one fixture manifest."""
    path = MANIFESTS / request.param
    return load(path.read_text()), load(inject_files(path))


def workloads(docs: list[Any]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in JOB_NAME_FIELD]


# --- what comes out ------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_injected_document_passes_its_strict_schema(case, version):
    _, out = case
    for doc in out:
        if (doc["apiVersion"], doc["kind"]) in crd_schema.schemas():
            crd_schema.validate(doc, version)
        else:
            kubernetes_validate.validate(doc, version, strict=True)


def test_every_training_pod_gets_a_native_sidecar_sharing_the_journal(case):
    _, out = case
    (workload,) = workloads(out)
    for replica, template in templates(workload).items():
        spec = template["spec"]
        sidecar = spec["initContainers"][0]  # first: up before any other init container
        assert sidecar["name"] == SIDECAR and sidecar["restartPolicy"] == "Always"
        assert sidecar["image"] == "nvrx-slo-sidecar:9.9"
        assert sidecar["securityContext"]["readOnlyRootFilesystem"] is True
        assert sidecar["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        trainer = named(spec["containers"], TRAINER[workload["kind"]][replica])
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert "emptyDir" in volumes["journal"]
        assert "serviceAccountToken" in volumes["sidecar-api-token"]["projected"]["sources"][0]
        journal = named(trainer["volumeMounts"], "journal")["mountPath"]
        assert named(sidecar["volumeMounts"], "journal") == {"name": "journal", "mountPath": journal, "readOnly": True}
        for container in (sidecar, trainer):
            env = {e["name"]: e for e in container["env"]}
            assert env[schema.JOURNAL_DIR_ENV]["value"] == journal
            assert env["NVRX_SLO_JOB"]["valueFrom"]["fieldRef"]["fieldPath"] == JOB_NAME_FIELD[workload["kind"]]
        assert template["metadata"]["labels"][MONITOR_LABEL[0]] == MONITOR_LABEL[1]
        others = [c for c in spec["containers"] if c is not trainer]
        assert all(not c.get("env") or "NVRX_SLO_JOB" not in {e["name"] for e in c["env"]} for c in others)


# The GPUs each pod template asks for, as the manifests in tests/manifests/ write them (a driver pod: none).
ACCELERATORS = {"Job": {"spec.template": 8}, "PyTorchJob": {"Master": 4, "Worker": 4},
                "JobSet": {"driver": None, "workers": 8}}


def test_each_sidecar_is_told_the_accelerators_its_pod_asks_for(case):
    """Badput is priced per accelerator: the sidecar shares its pod's GPUs among the ranks it accounts
    (``--accelerators-per-pod``); a pod that asks for none says nothing (one per rank)."""
    _, out = case
    (workload,) = workloads(out)
    for replica, template in templates(workload).items():
        args = template["spec"]["initContainers"][0]["args"]
        said = [float(a.split("=")[1]) for a in args if a.startswith("--accelerators-per-pod=")]
        expected = ACCELERATORS[workload["kind"]][replica]
        assert said == ([] if expected is None else [expected]), (replica, args)


def test_a_gpu_resource_that_is_not_a_count_is_refused_naming_it():
    (doc,) = load((MANIFESTS / "aws-indexed-job.yaml").read_text())[2:]
    doc["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "eight"
    with pytest.raises(inject.InjectError, match="nvidia.com/gpu is 'eight'"):
        inject.inject_stream([("job.yaml", yaml.safe_dump(doc))], "nvrx-slo-sidecar:9.9", None)


def _interval_s(text: str) -> float:
    assert text.endswith("s"), text
    return float(text[:-1])


def test_the_pod_grace_period_holds_the_sidecars_two_final_scrapes():
    """After SIGTERM the sidecar serves its final numbers to two scrapes (the second keeps them fresh
    for the rules' next evaluation), waiting --final-scrape-timeout at most: that must cover two of the
    PodMonitor's intervals and fit in the pod's grace period, or the kubelet kills it first."""
    (monitor,) = load((ROOT / "deploy" / "base" / "podmonitor.yaml").read_text())
    interval = max(_interval_s(e["interval"]) for e in monitor["spec"]["podMetricsEndpoints"])
    for given in (None, 10, 30, 120):
        (doc,) = load((MANIFESTS / "aws-indexed-job.yaml").read_text())[2:]
        if given is not None:
            doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = given
        (out,) = load(inject.inject_stream([("job.yaml", yaml.safe_dump(doc))], "nvrx-slo-sidecar:9.9", None))
        pod = out["spec"]["template"]["spec"]
        (timeout,) = [float(a.split("=")[1]) for a in pod["initContainers"][0]["args"]
                      if a.startswith("--final-scrape-timeout=")]
        assert 2 * interval < timeout < pod["terminationGracePeriodSeconds"]
        assert pod["terminationGracePeriodSeconds"] == max(given or 30, GRACE_S)  # a longer one is the user's


def test_taking_the_sidecar_out_again_gives_the_input(case):
    """The training container keeps its fields, and nothing else moved: not the other containers, the
    pod's settings or the controller's."""
    given, out = case
    assert [strip(d) if d["kind"] in JOB_NAME_FIELD else d for d in out] == given


def test_documents_it_does_not_inject_pass_through_unchanged_and_in_order():
    given = load((MANIFESTS / "aws-indexed-job.yaml").read_text())
    out = load(inject_files(MANIFESTS / "aws-indexed-job.yaml"))
    assert [d["kind"] for d in out] == ["Service", "ConfigMap", "Job"]
    assert out[:2] == given[:2]
    assert out[1]["data"]["ft.yaml"] == given[1]["data"]["ft.yaml"]  # a multi-line string, as it was


@pytest.mark.parametrize("name", CASES)
def test_injecting_twice_changes_nothing(name):
    once = inject_files(MANIFESTS / name)
    assert inject.inject_stream([("once", once)], "nvrx-slo-sidecar:9.9", None) == once


def test_injecting_with_another_image_upgrades_the_sidecar_in_place_and_says_so(tmp_path, capsys):
    """A manifest injected with an older image, its sidecar moved behind the user's init container:
    injecting it again with a new image changes that image there and nothing else, says so on stderr,
    and injecting the result again with the same image gives the same bytes."""
    docs = load(inject_files(MANIFESTS / "aws-indexed-job.yaml", image="registry.example/nvrx-slo-sidecar:0.1.0"))
    inits = _pod(docs[2])["initContainers"]
    inits.append(inits.pop(0))
    path = tmp_path / "injected.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    assert inject.main(["--image=registry.example/nvrx-slo-sidecar:0.2.0", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == (f"nvrx-slo inject: {path}, document 3 (Job llama-fsdp): spec.template: upgraded init container "
                   "'nvrx-slo-sidecar' (changed: image)\n")
    upgraded = load(out)
    assert [c["name"] for c in _pod(upgraded[2])["initContainers"]] == [c["name"] for c in inits] == [
        "fetch-tokenizer", SIDECAR]
    inits[1]["image"] = "registry.example/nvrx-slo-sidecar:0.2.0"
    assert upgraded == docs
    path.write_text(out)
    assert inject.main(["--image=registry.example/nvrx-slo-sidecar:0.2.0", str(path)]) == 0
    again, err = capsys.readouterr()
    assert again == out and err == ""


def test_injecting_a_manifest_an_older_version_injected_brings_every_part_of_ours_up_to_date(capsys):
    """What an older inject may have written differently — the sidecar's arguments, a volume's size, a
    mount missing on the trainer, the monitor label's value — is this version's after injecting again,
    in place; what is not ours is untouched (taking our parts out gives the input)."""
    given = load((MANIFESTS / "aws-indexed-job.yaml").read_text())
    fresh = load(inject_files(MANIFESTS / "aws-indexed-job.yaml"))
    older = copy.deepcopy(fresh)
    pod = _pod(older[2])
    named(pod["initContainers"], SIDECAR)["args"] = ["sidecar", "--port=9400"]
    named(pod["volumes"], "journal")["emptyDir"] = {"sizeLimit": "256Mi"}
    _trainer(older[2])["volumeMounts"] = [m for m in _trainer(older[2])["volumeMounts"] if m["name"] != "journal"]
    older[2]["spec"]["template"]["metadata"]["labels"][MONITOR_LABEL[0]] = "yes"
    upgraded: list[str] = []
    out = load(inject.inject_stream([("older", yaml.safe_dump_all(older))], "nvrx-slo-sidecar:9.9", None, upgraded))
    assert out == fresh and strip(out[2]) == given[2]
    assert [u.split("spec.template: upgraded ")[1] for u in upgraded] == [
        "init container 'nvrx-slo-sidecar' (changed: args)", "volume 'journal' (changed: emptyDir)",
        "pod label 'nvrx-slo/monitor' ('yes' to 'true')"]



@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_projects_own_overlays_inject_again_with_any_image(overlay):
    """The overlays' workloads are inject's own output (`nvrx-slo generate deploy`): the real command
    injects them again, with their own image (the same documents) or another (only the sidecar's
    image changes)."""
    path = ROOT / "deploy" / "overlays" / overlay / "generated" / "workload.yaml"
    given = load(path.read_text())
    (image,) = {named(t["spec"]["initContainers"], SIDECAR)["image"] for d in workloads(given)
                for t in templates(d).values()}
    same = run(f"--image={image}", str(path))
    assert same.returncode == 0 and same.stderr == "", same.stderr
    assert load(same.stdout) == given
    other = run("--image=registry.example/nvrx-slo-sidecar:0.2.0", str(path))
    assert other.returncode == 0, other.stderr
    for doc in workloads(given):
        for template in templates(doc).values():
            named(template["spec"]["initContainers"], SIDECAR)["image"] = "registry.example/nvrx-slo-sidecar:0.2.0"
    assert load(other.stdout) == given
    assert other.stderr.count("upgraded init container 'nvrx-slo-sidecar' (changed: image)") == sum(
        len(templates(d)) for d in workloads(given))


def test_the_sidecars_pod_parts_are_written_once_not_in_the_projects_workloads():
    """deploy/workloads/ are the overlays' sources as one writes them: every part of the sidecar comes
    from sidecar_pod.yaml at generation, none is copied in by hand."""
    parts = inject.load_spec()
    sources = sorted((ROOT / inject.WORKLOADS).glob("*.yaml"))
    assert [p.stem for p in sources] == sorted(OVERLAYS)
    for path in sources:
        for doc in workloads(load(path.read_text())):
            for template in templates(doc).values():
                spec = template["spec"]
                has = {c["name"] for c in spec.get("initContainers", [])} | {v["name"] for v in spec["volumes"]}
                has |= {e["name"] for c in spec["containers"] for e in c.get("env", [])}
                has |= set(template["metadata"].get("labels", {}))
                assert has.isdisjoint({parts["sidecar"]["name"], *OUR_VOLUMES, *OUR_TRAINER_ENV, *parts["labels"]})


# --- the command line ------------------------------------------------------------------------------------

@pytest.mark.slow
def test_stdin_through_the_real_command_gives_what_the_files_give():
    text = (MANIFESTS / "aws-indexed-job.yaml").read_text()
    piped, from_file = run("-", stdin=text), run(str(MANIFESTS / "aws-indexed-job.yaml"))
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == from_file.stdout and piped.stderr == ""
    assert named(templates(load(piped.stdout)[2])["spec.template"]["spec"]["initContainers"], SIDECAR)["image"] \
        == inject.default_image()


def test_several_files_make_one_stream_in_order():
    out = load(inject_files(MANIFESTS / "jobset.yaml", MANIFESTS / "pytorchjob.yaml"))
    assert [d["kind"] for d in out] == ["JobSet", "PyTorchJob"]


def test_container_names_the_training_container(tmp_path):
    path = tmp_path / "job.yaml"
    doc = load((MANIFESTS / "pytorchjob.yaml").read_text())[0]
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["name"] = "train"
    doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"] = "train"
    path.write_text(yaml.safe_dump(doc))
    (out,) = load(inject_files(path, container="train"))
    for template in templates(out).values():
        env = {e["name"] for e in named(template["spec"]["containers"], "train")["env"]}
        assert schema.JOURNAL_DIR_ENV in env


def test_a_wrong_flag_exits_2_naming_it(capsys):
    with pytest.raises(SystemExit) as exit_:
        inject.main(["--imagee=x", str(MANIFESTS / "jobset.yaml")])
    assert exit_.value.code == 2 and "--imagee" in capsys.readouterr().err


# --- what it refuses -------------------------------------------------------------------------------------

def _aws_job() -> dict[str, Any]:
    return load((MANIFESTS / "aws-indexed-job.yaml").read_text())[2]


def _pod(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]


def _trainer(doc: dict[str, Any]) -> dict[str, Any]:
    return _pod(doc)["containers"][0]


def _two_unnamed_trainers(doc):
    _pod(doc)["containers"].append({**_trainer(doc), "name": "tensorboard", "ports": []})


def _a_volume_called_journal(doc):
    _pod(doc)["volumes"].append({"name": "journal", "persistentVolumeClaim": {"claimName": "audit-log"}})


def _something_else_mounted_at_journal(doc):
    _trainer(doc)["volumeMounts"].append({"name": "fsx", "mountPath": "/journal"})


def _journal_dir_set_elsewhere(doc):
    _trainer(doc)["env"].append({"name": schema.JOURNAL_DIR_ENV, "value": "/fsx/journal"})


def _trainer_serves_on_9400(doc):
    _trainer(doc)["ports"].append({"name": "prom", "containerPort": 9400})


def _a_regular_container_named_like_ours(doc):
    _pod(doc)["containers"].append({"name": SIDECAR, "image": "busybox"})


def _an_init_container_named_like_ours_running_something_else(doc):
    _pod(doc)["initContainers"] = [{"name": SIDECAR, "image": "busybox", "restartPolicy": "Always",
                                    "args": ["sleep", "infinity"]}]


def _monitor_label_off(doc):
    doc["spec"]["template"]["metadata"]["labels"]["nvrx-slo/monitor"] = "false"


def _no_pod_template(doc):
    del doc["spec"]["template"]


NOT_OURS = "is already there and is not nvrx-slo's"
REFUSALS = {  # sentence -> (how the Job is broken, flags, what the error must say)
    "two containers and none named by --container":
        (_two_unnamed_trainers, [],
         "cannot tell the training container among pytorch, tensorboard: name it with --container"),
    "--container names no container":
        (lambda doc: None, ["--container=trainer"],
         "no container named 'trainer' (--container); containers: pytorch"),
    "a volume named journal that is not ours":
        (_a_volume_called_journal, [],
         f"volume with name 'journal' {NOT_OURS} (differs in: emptyDir, persistentVolumeClaim)"),
    "another volume mounted at /journal":
        (_something_else_mounted_at_journal, [],
         f"container 'pytorch': volume mount with mountPath '/journal' {NOT_OURS} (differs in: name)"),
    "the journal env var set to another place":
        (_journal_dir_set_elsewhere, [],
         f"container 'pytorch': env var with name 'NVRX_SLO_JOURNAL_DIR' {NOT_OURS} (differs in: value)"),
    "the trainer already serves on the sidecar's port":
        (_trainer_serves_on_9400, [],
         "container 'pytorch' already declares port 'prom', which the sidecar uses"),
    "a regular container named like the sidecar":
        (_a_regular_container_named_like_ours, [],
         f"container named 'nvrx-slo-sidecar' {NOT_OURS} (a regular container, not a native sidecar)"),
    "an init container named like the sidecar that runs something else":
        (_an_init_container_named_like_ours_running_something_else, [],
         f"init container with name 'nvrx-slo-sidecar' {NOT_OURS} (differs in: args, env, image, livenessProbe, "
         "ports, readinessProbe, resources, securityContext, volumeMounts)"),
    "the monitor label set to something else":
        (_monitor_label_off, [],
         "pod label 'nvrx-slo/monitor' is already there with value 'false', not 'true'"),
    "a Job without a pod template":
        (_no_pod_template, [],
         "no spec.template"),
}


@pytest.mark.parametrize("sentence", REFUSALS)
def test_it_refuses_with_exit_2_naming_the_document_and_the_reason(sentence, tmp_path, capsys):
    breaks, flags, reason = REFUSALS[sentence]
    docs = load((MANIFESTS / "aws-indexed-job.yaml").read_text())
    breaks(docs[2])
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert inject.main([*flags, str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    template = "" if sentence == "a Job without a pod template" else "spec.template: "
    where = f"{path}, document 3 (Job llama-fsdp): {template}"
    assert err == f"nvrx-slo inject: {where}{reason}\n"


def test_it_refuses_what_is_not_yaml(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("kind: Job\n  spec: [\n")
    assert inject.main([str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"nvrx-slo inject: {path}: not YAML:")


def test_a_missing_file_is_named(tmp_path, capsys):
    assert inject.main([str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml" in capsys.readouterr().err
