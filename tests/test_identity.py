"""Pod identity from the Downward API: env first, then the labels file, then the service account."""

from __future__ import annotations

import socket

import pytest

from nvrx_slo.exporter.identity import from_environment, parse_labels_file
from nvrx_slo.trainer import launch_env
from nvrx_slo.trainer.journal import Writer


def test_env_gives_every_field(tmp_path):
    env = {"POD_NAMESPACE": "train", "POD_NAME": "llm-0-abcde", "NODE_NAME": "gpu-7", "NVRX_SLO_JOB": "llm",
           "JOB_COMPLETION_INDEX": "3", "HOSTNAME": "ignored"}
    ident = from_environment(env, None, service_account_namespace=tmp_path / "missing")
    assert (ident.namespace, ident.pod, ident.node, ident.job_name, ident.replica_index) == \
        ("train", "llm-0-abcde", "gpu-7", "llm", 3)
    assert ident.resource_attributes() == {"k8s.namespace.name": "train", "k8s.pod.name": "llm-0-abcde",
                                           "k8s.node.name": "gpu-7", "k8s.job.name": "llm",
                                           "k8s.job.completion_index": 3}


def test_files_fill_what_env_lacks(tmp_path):
    podinfo = tmp_path / "podinfo"
    podinfo.mkdir()
    (podinfo / "labels").write_text('app="llm"\nbatch.kubernetes.io/job-name="llm-run-7"\n'
                                    'batch.kubernetes.io/job-completion-index="12"\ncontroller-uid="abc"')
    ns = tmp_path / "namespace"
    ns.write_text("research\n")
    ident = from_environment({"HOSTNAME": "llm-run-7-12-xyz"}, podinfo, service_account_namespace=ns)
    assert (ident.namespace, ident.pod, ident.node, ident.job_name, ident.replica_index) == \
        ("research", "llm-run-7-12-xyz", "", "llm-run-7", 12)
    assert "k8s.node.name" not in ident.resource_attributes()


def test_outside_kubernetes_only_the_pod_is_known(tmp_path):
    ident = from_environment({}, tmp_path / "nowhere", service_account_namespace=tmp_path / "missing")
    assert ident.pod and (ident.namespace, ident.node, ident.job_name, ident.replica_index) == ("", "", "", None)


def test_labels_file_values_are_go_quoted():
    assert parse_labels_file('a="x \\"y\\""\nb=plain\nnot a label\n') == {"a": 'x "y"', "b": "plain"}


@pytest.mark.parametrize("env", [
    {"POD_NAME": "llm-0-abcde", "NODE_NAME": "gpu-7", "NVRX_SLO_JOB": "llm", "HOSTNAME": "ignored"},
    {"HOSTNAME": "llm-run-7-12-xyz", "NODE_NAME": "gpu-3"},
    {},
], ids=["downward-api", "hostname-only", "outside-kubernetes"])
def test_the_trainer_and_the_sidecar_name_the_same_pod_node_and_job(tmp_path, env):
    """The engine joins the journal's records to the sidecar's series by these three strings."""
    sidecar = from_environment(env, None, service_account_namespace=tmp_path / "missing")
    trainer = Writer.from_env(env)
    assert (trainer.pod, trainer.node, trainer.job) == (sidecar.pod, sidecar.node, sidecar.job_name)
    assert trainer.pod == (env.get("POD_NAME") or env.get("HOSTNAME") or socket.gethostname())


# As the launchers set them: torchrun's agent for worker 3 of a 2 × 4 job after one restart, srun
# for task 5 of `srun -N 3 -n 7` (tasks per node "3(x2),1": this is node 1's third task), both.
TORCHRUN = {"RANK": "7", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
            "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "llm-42"}
SRUN = {"SLURM_PROCID": "5", "SLURM_LOCALID": "2", "SLURM_NTASKS": "7", "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "3(x2),1", "SLURM_JOB_ID": "81234", "SLURM_RESTART_COUNT": "2",
        "SLURMD_NODENAME": "gpu-node-12"}


@pytest.mark.parametrize("env, want", [
    (TORCHRUN, ("llm-42", "", 7, 3, 1, 4, 3)),
    (SRUN, ("81234", "gpu-node-12", 5, 2, 2, 3, None)),
    ({**SRUN, **TORCHRUN}, ("81234", "gpu-node-12", 7, 3, 1, 4, 3)),  # srun starting torchrun: torchrun's ranks
    ({"TORCHELASTIC_RUN_ID": "none", "SLURM_NODEID": "3", "SLURM_TASKS_PER_NODE": "3(x2),1"},
     ("", "", 0, 0, 0, None, None)),  # torchrun without --rdzv-id names no job; no 4th node in the list
    ({}, ("", "", 0, 0, 0, None, None)),  # plain python: rank 0 of one
], ids=["torchrun", "srun", "srun-then-torchrun", "unnamed", "python"])
def test_a_rank_reads_who_it_is_from_its_launchers_environment(env, want):
    """Without extra arguments: what the journal stamps on every record, and what process_start
    says of the pod (its workers) and of the launcher (the restarts it may make)."""
    ident = Writer.from_env({**env, "HOSTNAME": "host-a"})
    assert (ident.job, ident.node, ident.rank, ident.local_rank, ident.restart, launch_env.local_world_size(env),
            launch_env.max_restarts(env)) == want
