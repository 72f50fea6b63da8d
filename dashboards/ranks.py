"""Ranks & accelerators: a job in lock step is as slow as its slowest rank, so look at ranks one
by one — step time, stragglers, idle accelerators, and the work each rank has not yet saved."""

from __future__ import annotations

from collections.abc import Callable

from grafanalib import core as g

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.conventions import SIDECAR_IDLE_SOURCES, STEP_SKEW, Dashboard, accelerator_idle
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.spec import Spec
from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.dashboards import panels as p
from nvrx_slo.dashboards import queries as q

UID = Dashboard.RANKS.value  # stable: the alerts link to it

_RANK = (q.RANK_LABEL,)
_RANK_SOURCE = (q.RANK_LABEL, q.SOURCE_LABEL)
_STEP_TIME = q.mean_per_event(cat.STEP_DURATION, _RANK, window=q.RATE_INTERVAL)


def _best_per_rank(idle_of: Callable[[cat.GpuIdleSource], str]) -> str:
    """Each rank's idle from the best source the sidecar has for it (DCGM is per GPU, not per rank)."""
    return f" or on ({q.RANK_LABEL}) ".join(idle_of(s) for s in SIDECAR_IDLE_SOURCES)


_IDLE_SINCE_START = _best_per_rank(
    lambda s: f"{q.by(_RANK_SOURCE, q.series(cat.GPU_IDLE, source=s))}"
              f" / ignoring({q.SOURCE_LABEL}) group_left() {q.by(_RANK, q.series(cat.WALL))}")
_IDLE_PER_RANK = _best_per_rank(lambda s: q.by(_RANK_SOURCE, q.rate(cat.GPU_IDLE, source=s)))


def _steps(spec: Spec) -> list[object]:
    skew, stalled = spec.alerts.straggler_skew, spec.alerts.stalled_after
    return [
        p.heatmap("Step time per rank", "Mean seconds per training step over the rate window, one row per rank "
                  "(colour = step time). A row hotter than the rest is a straggler.",
                  p.Query(_STEP_TIME, "{{rank}}"), p.SECONDS, w=12, h=9),
        p.timeseries("Straggler view: step-time skew", "Each rank's mean step time over the job's median rank's, "
                     f"the job's every pod included (1 = typical; the rule {STEP_SKEW} the straggler alert reads). "
                     f"Dashed: {skew:g}×, where the alert counts a rank as one.",
                     [p.Query(q.by(("pod", q.RANK_LABEL), q.record(STEP_SKEW), "max"), "{{pod}} rank {{rank}}")],
                     p.COUNT,
                     steps=((None, p.GREEN), (skew, p.RED)), h=9),
        p.timeseries("Steps per second per rank", "Training steps completed per second over the rate window, per "
                     "rank (rolled-back steps included).",
                     [p.Query(q.by(_RANK, q.rate(cat.STEPS)), "rank {{rank}}")], p.PER_SECOND),
        p.timeseries("Seconds since last step", "Time since each rank's latest completed step: a rank that stops "
                     "here while the others go on is stuck. Dashed: the training-stalled alert's "
                     f"{duration.format(stalled)}.",
                     [p.Query(f"time() - {q.by(_RANK, q.series(cat.LAST_STEP_TIMESTAMP), 'max')}", "rank {{rank}}")],
                     p.SECONDS, steps=((None, p.GREEN), (float(stalled), p.RED))),
    ]


def _accelerators(spec: Spec) -> list[object]:
    ratio, over = spec.alerts.idle_ratio, duration.format(spec.alerts.idle_over)
    idle_steps = ((None, p.GREEN), (ratio, p.RED))
    return [
        p.stat("Accelerator idle since job start", "Share of each rank's wall time its accelerator sat idle, from "
               "the best source the sidecar has for it (in the legend): nvml (sampled utilisation, where the "
               "sidecar sees GPUs), else step_phases (inferred from the journal). DCGM keeps no job-long total: "
               f"see the job panel. Red above the accelerator-idle alert's {ratio:.0%}.",
               [p.Query(_IDLE_SINCE_START, "rank {{rank}} ({{source}})")], p.RATIO, steps=idle_steps, decimals=1,
               w=6, h=8),
        p.timeseries("Accelerator idle, job", f"The job's idle accelerator share over the last {over}, from the "
                     "best source it has (in the legend): dcgm (dcgm-exporter: engine activity of the job's GPUs, "
                     "else their utilisation), else nvml, else step_phases. The very value the accelerator-idle "
                     "alert compares, read from the recording rules the alerts install. Dashed: the alert's "
                     f"{ratio:.0%}.",
                     [p.Query(accelerator_idle(over, q.JOB_MATCHERS), "job ({{source}})")], p.RATIO, steps=idle_steps,
                     w=9),
        p.timeseries("Accelerator idle per rank", "Idle accelerator seconds per second of wall over the rate window "
                     "(1 = idle all the time), per rank, from the best source the sidecar has for it (in the legend): "
                     f"nvml, else step_phases. Dashed: the accelerator-idle alert's {ratio:.0%}.",
                     [p.Query(_IDLE_PER_RANK, "rank {{rank}} ({{source}})")], p.RATIO, steps=idle_steps, w=9),
        p.timeseries("Unprotected work per rank", "Seconds of training each rank did since the last durable "
                     "checkpoint: lost if a fault comes now. Drops to 0 when a save lands.",
                     [p.Query(q.by((q.POD_LABEL, q.RANK_LABEL), q.series(cat.UNPROTECTED_WORK)),
                              "{{pod}} rank {{rank}}")], p.SECONDS, w=24),
    ]


def dashboard(spec: Spec, plan: Plan) -> g.Dashboard:
    """Per-rank panels, none reading a window of the plan (the idle alert's own window is the spec's)."""
    return p.dashboard(
        uid=UID, title="nvrx-slo / Ranks & accelerators", module="ranks",
        description="Per-rank step time, stragglers, accelerator idle time and unprotected work for one job.",
        panels=[p.row("Step time"), *_steps(spec), p.row("Accelerators and unsaved work"), *_accelerators(spec)],
    )
