"""deploy/images/ and the commands the manifests run.

No Docker engine runs here, so the images are checked by what can be run without one:

* each Dockerfile's COPY lines are replayed into a scratch build context, and its `pip install`
  line is run there — for the sidecar for real, in a fresh venv that then starts
  `nvrx-slo sidecar` with the manifest's own arguments and serves /metrics, with no torch or NVRx
  installed and the trainer code deleted; for the trainer as a `pip install --dry-run` resolution in
  the project venv, whose torch stands in for the CUDA base image's (its 2.x satisfies the same ranges);
* every command and flag a manifest names is parsed by the real parser it reaches (the
  `nvrx-slo` console script, its subcommand table, ft_launcher's argument parser, the reference
  job's and the sidecar's argument parsers).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from deploy_model import OVERLAYS, ROOT, containers, env_of, pod_template
from nvrx_slo import cli
from servers import free_port

IMAGES = ROOT / "deploy" / "images"
SRC = "/src"  # where the Dockerfiles COPY the project


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) for each instruction, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines
            if line and not line.startswith("#")]


def one(dockerfile: Path, instruction: str) -> str:
    (value,) = [rest for ins, rest in instructions(dockerfile) if ins == instruction]
    return value


def pip_install_args(dockerfile: Path) -> list[str]:
    """The arguments of the Dockerfile's single `pip install` (up to the next `&&`)."""
    (run,) = [rest for ins, rest in instructions(dockerfile) if ins == "RUN" and "pip install" in rest]
    words = shlex.split(run.split("&&")[0])
    return words[words.index("install") + 1:]


def image_drops(dockerfile: Path) -> list[str]:
    """The package's folders the image removes once installed (its ``cd <package> && rm -r ...`` line)."""
    (run,) = [rest for ins, rest in instructions(dockerfile) if ins == "RUN" and "rm -r " in rest]
    return shlex.split(run.split("rm -r ", 1)[1])


def build_context(dockerfile: Path, scratch: Path) -> Path:
    """Replay the Dockerfile's COPY lines from the repository into ``scratch``; returns where /src went."""
    for ins, rest in instructions(dockerfile):
        if ins != "COPY":
            continue
        *sources, dest = shlex.split(rest)
        target = scratch / dest.lstrip("/")
        for source in sources:
            path = ROOT / source
            if dest.endswith("/"):
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, target / path.name)
            else:
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
    return scratch / SRC.lstrip("/")


# --- the Dockerfiles -------------------------------------------------------------------------

def test_the_images_copy_every_package_the_project_ships():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib

    packages = {"nvrx_slo", *tomllib.loads((ROOT / "pyproject.toml").read_text())
                ["tool"]["setuptools"]["package-dir"].values()}
    for dockerfile in ("sidecar.Dockerfile", "trainer.Dockerfile"):
        copied = {source for ins, rest in instructions(IMAGES / dockerfile) if ins == "COPY"
                  for source in shlex.split(rest)[:-1]}
        assert copied == packages | {"pyproject.toml", "README.md"}, dockerfile
        assert all((ROOT / source).exists() for source in copied)


@pytest.mark.external
def test_the_images_run_as_the_non_root_user_the_pods_ask_for(kustomized):
    for overlay in OVERLAYS:
        security = pod_template(kustomized[overlay])["spec"]["securityContext"]
        for dockerfile in ("sidecar.Dockerfile", "trainer.Dockerfile"):
            assert one(IMAGES / dockerfile, "USER") == f"{security['runAsUser']}:{security['runAsGroup']}"


@pytest.mark.external
def test_the_sidecar_image_is_slim_and_its_port_is_the_one_scraped(kustomized):
    sidecar_file = IMAGES / "sidecar.Dockerfile"
    assert re.fullmatch(r"python:3\.\d+-slim\S*", one(sidecar_file, "FROM"))
    assert pip_install_args(sidecar_file) == ["--no-cache-dir", f"{SRC}[sidecar]"]  # no trainer extra
    assert json.loads(one(sidecar_file, "ENTRYPOINT")) == ["nvrx-slo"]
    for overlay in OVERLAYS:
        sidecar, _ = containers(pod_template(kustomized[overlay]))
        assert "command" not in sidecar  # the image's ENTRYPOINT runs; the manifest gives the arguments
        assert one(sidecar_file, "EXPOSE") == str(sidecar["ports"][0]["containerPort"])


def test_the_trainer_image_pins_an_nvrx_the_trainer_extra_accepts():
    args = pip_install_args(IMAGES / "trainer.Dockerfile")
    assert f"{SRC}[trainer]" in args
    (nvrx,) = [Requirement(a) for a in args if a.startswith("nvidia-resiliency-ext")]
    (pinned,) = nvrx.specifier
    assert pinned.operator == "=="
    extra = [Requirement(r) for r in importlib.metadata.requires("nvrx-slo") or []]
    (wanted,) = [r for r in extra if r.name == "nvidia-resiliency-ext"]
    assert wanted.specifier.contains(pinned.version)


# --- the commands the manifests run ------------------------------------------------------------

def expand(args: list[str], container: dict[str, Any]) -> list[str]:
    """Kubernetes' $(VAR) expansion of args from the container's env, with a sample value each."""
    names = {e["name"] for e in container.get("env", [])}
    return [re.sub(r"\$\((\w+)\)", lambda m: f"sample-{m[1].lower()}" if m[1] in names else m[0], a) for a in args]


def subcommand(name: str):
    entry = cli.COMMANDS[name][0]
    module, func = entry.split(":")
    return getattr(importlib.import_module(module), func)


def test_the_console_script_is_the_cli_the_manifests_call():
    (script,) = [e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "nvrx-slo"]
    assert script.load() is cli.main


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.torch
@pytest.mark.nvrx
@pytest.mark.external
def test_every_trainer_flag_is_one_its_parser_accepts(kustomized, overlay):
    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig
    from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser

    from nvrx_slo.trainer.reference import job as reference_job

    _, trainer = containers(pod_template(kustomized[overlay]))
    program, name = trainer["command"]
    assert program == "nvrx-slo" and callable(subcommand(name)) and name == "ft-launcher"
    args = expand(trainer["args"], trainer)
    launcher = get_args_parser().parse_args(args)  # ft_launcher's own parser (exits on a bad flag)
    FaultToleranceConfig.from_args(launcher)  # raises when the launcher would find no FT config
    assert launcher.module and launcher.training_script == "nvrx_slo.trainer.reference.job"
    assert importlib.util.find_spec(launcher.training_script) is not None
    config = reference_job.parse_args(launcher.training_script_args)
    assert str(config.checkpoint_dir) in {m["mountPath"] for m in trainer["volumeMounts"]}
    if overlay == "indexed-job":
        assert launcher.rdzv_id == "sample-nvrx_slo_job" and launcher.max_restarts > 0


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.external
def test_every_sidecar_flag_is_one_its_parser_accepts(kustomized, overlay, monkeypatch):
    if importlib.util.find_spec("nvrx_slo.exporter.sidecar") is None:
        pytest.skip("exporter/sidecar.py does not exist yet")
    from nvrx_slo.exporter import sidecar as sidecar_mod

    sidecar, _ = containers(pod_template(kustomized[overlay]))
    name, *args = sidecar["args"]
    assert subcommand(name) is sidecar_mod.main
    env = {k: v for k, v in env_of(sidecar).items() if isinstance(v, str)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = sidecar_mod.parse_args(expand(args, sidecar))
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    assert str(config.journal_dir) == mounts["journal"]
    assert config.state_file.parent == Path(mounts["sidecar-state"])
    assert config.port == sidecar["ports"][0]["containerPort"] and config.host == "0.0.0.0"


# --- the images' pip lines -------------------------------------------------------------------

def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, ""


@pytest.mark.slow
def test_the_trainer_image_pip_line_resolves(tmp_path):
    src = build_context(IMAGES / "trainer.Dockerfile", tmp_path)
    args = [a.replace(SRC, str(src)) for a in pip_install_args(IMAGES / "trainer.Dockerfile")]
    report = tmp_path / "report.json"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report),
                          *args], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    (project,) = [i for i in json.loads(report.read_text())["install"] if i["metadata"]["name"] == "nvrx-slo"]
    assert project["requested_extras"] == ["trainer"]
    assert "trainer" in project["metadata"]["provides_extra"]


@pytest.mark.slow
@pytest.mark.external
def test_the_sidecar_image_installs_without_torch_and_serves_metrics(kustomized, tmp_path):
    """The sidecar Dockerfile's install, replayed in a fresh venv, runs the manifest's sidecar command."""
    if importlib.util.find_spec("nvrx_slo.exporter.sidecar") is None:
        pytest.skip("exporter/sidecar.py does not exist yet")
    src = build_context(IMAGES / "sidecar.Dockerfile", tmp_path / "context")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    args = [a.replace(SRC, str(src)) for a in pip_install_args(IMAGES / "sidecar.Dockerfile")]
    out = subprocess.run([venv / "bin" / "pip", "install", "--quiet", *args], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    installed = subprocess.run([venv / "bin" / "python", "-m", "pip", "list", "--format=json"],
                               capture_output=True, text=True, check=True).stdout
    names = {p["name"].lower() for p in json.loads(installed)}
    assert "nvrx-slo" in names and not names & {"torch", "nvidia-resiliency-ext"}
    package = subprocess.run([venv / "bin" / "python", "-c", "import nvrx_slo; print(nvrx_slo.__path__[0])"],
                             capture_output=True, text=True, check=True, cwd=tmp_path).stdout.strip()
    dropped = image_drops(IMAGES / "sidecar.Dockerfile")
    assert "trainer" in dropped  # the build needs the folder; the sidecar must not
    for folder in dropped:
        shutil.rmtree(Path(package) / folder)

    sidecar, _ = containers(pod_template(kustomized["indexed-job"]))
    port = free_port()
    journal = tmp_path / "journal"
    journal.mkdir()
    mounts = {m["name"]: m["mountPath"] for m in sidecar["volumeMounts"]}
    state = tmp_path / "state"
    state.mkdir()
    cmd_args = [a.replace(f"--port={sidecar['ports'][0]['containerPort']}", f"--port={port}")
                .replace(mounts["sidecar-state"], str(state)) for a in sidecar["args"]]
    env = {"PATH": os.environ["PATH"], "NVRX_SLO_JOURNAL_DIR": str(journal), "POD_NAMESPACE": "nvrx-training",
           "POD_NAME": "nvrx-reference-0-abcde", "NODE_NAME": "node-a", "NVRX_SLO_JOB": "nvrx-reference",
           "JOB_COMPLETION_INDEX": "0"}
    proc = subprocess.Popen([venv / "bin" / "nvrx-slo", *cmd_args, "--host=127.0.0.1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:  # as the kubelet's readiness probe does
            try:
                if get(f"{base}/readyz")[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert get(f"{base}/readyz")[0] == 200
        assert get(f"{base}/healthz")[0] == 200
        status, metrics = get(f"{base}/metrics")
        assert status == 200 and "nvrx_exporter_events_total" in metrics
        assert 'namespace="nvrx-training"' in metrics and 'job_name="nvrx-reference"' in metrics
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
