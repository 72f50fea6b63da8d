"""Accelerator idle per job, recorded once per source (``conventions.accelerator_idle`` reads the best a job has).

Three sources, best first (``conventions.IDLE_SOURCES``):

* ``dcgm``: NVIDIA's dcgm-exporter (a DaemonSet on the GPU nodes) measures every GPU in the driver
  and names the pod it is allocated to. Idle = 1 − ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (share of time
  the graphics engine was busy: a profiling metric, the one operators trust) or, for a GPU without
  that series (profiling metrics off), 1 − ``DCGM_FI_DEV_GPU_UTIL`` / 100; averaged over the job's
  GPUs. A GPU reaches a job through its pod: every sidecar exports ``nvrx_pod_ranks`` with
  ``namespace, job_name, pod``, so a GPU of any other pod, or of none, matches no job.
* ``nvml``: the sidecar's own NVML sampler, only where its container sees the GPUs (in Kubernetes it
  requests none, so usually it does not).
* ``step_phases``: the journal's step phases (every second not in compute or optimizer); always there.

Each is recorded at every evaluation as ``ACCELERATOR_IDLE{source=…}``, one series per job (the
sidecar's counters over the shortest SLO window). The alert and the dashboards average those over
their own window, so no window re-reads per-GPU or per-rank series; the DCGM rule is the one join,
by pod, over the GPUs allocated to some pod.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

from nvrx_slo.alerts.conventions import ACCELERATOR_IDLE, BY_JOB, DCGM, IDLE_SOURCE_LABEL, SIDECAR_IDLE_SOURCES
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.sli import share_of_wall
from nvrx_slo.contracts import catalogue as cat

Rule = dict[str, Any]

ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"  # ratio 0..1
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent 0..100

_NAMESPACE, _JOB, _POD = cat.IDENTITY_LABELS
# The labels dcgm-exporter's series name the GPU's pod with, as Prometheus stores them, keyed by ours.
# Assumed: its Kubernetes pod mapping is on (DCGM_EXPORTER_KUBERNETES=true)
# and Prometheus scrapes it with honorLabels: true, so they keep dcgm-exporter's names. Without
# honorLabels Prometheus renames them exported_namespace and exported_pod: say so here.
DCGM_POD_LABELS: Mapping[str, str] = {_NAMESPACE: "namespace", _POD: "pod"}
# One GPU, or one MIG instance of it (a label a series lacks matches as empty).
DCGM_GPU_LABELS = ("UUID", "GPU_I_ID")


def _indent(expr: str) -> str:
    return textwrap.indent(expr, "  ")


def dcgm_idle(pod_labels: Mapping[str, str] = DCGM_POD_LABELS) -> str:
    """Idle share of each job's GPUs: engine active where a GPU has it, else utilisation."""
    allocated = f'{{{pod_labels[_POD]}!=""}}'  # GPUs of no pod drop out before the join
    per_gpu = f"1 - {ENGINE_ACTIVE}{allocated}\nor on ({', '.join(DCGM_GPU_LABELS)})\n1 - {GPU_UTIL}{allocated} / 100"
    for ours, theirs in pod_labels.items():
        if theirs != ours:
            per_gpu = f'label_replace(\n{_indent(per_gpu)},\n  "{ours}", "$1", "{theirs}", "(.+)"\n)'
    pods = f"group by ({', '.join(cat.IDENTITY_LABELS)}) ({cat.POD_RANKS.name})"
    join = f"(\n{_indent(per_gpu)}\n)\n* on ({_NAMESPACE}, {_POD}) group_left ({_JOB})\n{pods}"
    return f"avg {BY_JOB} (\n{_indent(join)}\n)"


def _record(expr: str, source: str) -> Rule:
    return {"record": ACCELERATOR_IDLE, "expr": expr, "labels": {IDLE_SOURCE_LABEL: source}}


def records(plan: Plan) -> list[Rule]:
    """One rule per source; the sidecar's counters as a share of wall over the shortest SLO window."""
    return [_record(dcgm_idle(), DCGM)] + [
        _record(share_of_wall(f'{cat.GPU_IDLE.name}{{{IDLE_SOURCE_LABEL}="{s.value}"}}', plan.base), s.value)
        for s in SIDECAR_IDLE_SOURCES
    ]
