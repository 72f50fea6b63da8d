"""Where a pod's processes read which job, pod and node they belong to.

The trainer stamps these on every journal record and the sidecar on its series; the engine joins
the two by them, so both read them here, and ``nvrx-slo inject`` and the demo set them by these
names. In Kubernetes the Downward API sets ``POD_NAME`` and ``NODE_NAME``; ``nvrx-slo inject``
sets ``NVRX_SLO_JOB`` from the controller's job-name label. Outside it, srun and torchrun name the
job and node where nothing else does.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping

JOB = "NVRX_SLO_JOB"
POD = "POD_NAME"
NODE = "NODE_NAME"


def job(env: Mapping[str, str]) -> str:
    """The job's name: ``NVRX_SLO_JOB``, else what names the job to the launcher that started the
    process (srun's ``SLURM_JOB_ID``; torchrun's ``TORCHELASTIC_RUN_ID``, its ``--rdzv-id``, which
    is "none" unless given or ``--standalone``); "" where nothing names it."""
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    return env.get(JOB) or env.get("SLURM_JOB_ID") or (run_id if run_id != "none" else "")


def pod(env: Mapping[str, str]) -> str:
    """The pod's name: ``HOSTNAME`` is the pod name in Kubernetes too; outside it, the host's name."""
    return env.get(POD) or env.get("HOSTNAME") or socket.gethostname()


def node(env: Mapping[str, str]) -> str:
    """The node's name: ``NODE_NAME`` in Kubernetes, Slurm's ``SLURMD_NODENAME`` under srun, else ""."""
    return env.get(NODE) or env.get("SLURMD_NODENAME", "")
