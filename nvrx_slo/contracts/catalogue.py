"""The metric catalogue: every metric nvrx-slo emits — name, kind, unit, labels, help, buckets.

The exporter's views (Prometheus collector, OTLP instruments), the generated alert rules, the
dashboards and the docs all import these objects, so a renamed metric breaks a test here rather
than a dashboard in production. Stdlib only.

Label conventions
-----------------
* ``IDENTITY_LABELS`` (``namespace``, ``job_name``, ``pod``) are on every series. ``job_name``,
  not ``job``: Prometheus owns ``job``. The PodMonitor sets ``honorLabels: true``.
* Metrics with ``per_rank=True`` also carry ``rank``. When per-rank series are switched off (or
  a pod has more ranks than the cap), the sidecar emits one series per pod with
  ``rank="all"`` holding the sum over its ranks, so ``sum by (namespace, job_name)`` is right
  either way.
* Time is accounted in rank-seconds: a pod with 8 ranks accrues 8 wall seconds per second.
  Efficiency = productive / wall, so sums over ranks give the rank-average efficiency.

Time accounting
---------------
``nvrx_time_seconds_total{category}`` holds every *settled* category. Work done since the last
durable checkpoint is not settled yet — it becomes ``productive`` when the next save lands or
``lost`` if a fault rolls it back — so it is the gauge ``nvrx_unprotected_work_seconds``, never a
counter that would have to go down. The invariant, at every scrape:

    sum(nvrx_time_seconds_total) + nvrx_unprotected_work_seconds == nvrx_wall_seconds_total
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

PREFIX = "nvrx_"
IDENTITY_LABELS: tuple[str, ...] = ("namespace", "job_name", "pod")
RANK_LABEL = "rank"
ALL_RANKS = "all"


class Kind(str, Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
    SUMMARY = "summary"  # a histogram's _sum and _count only: what a mean needs, two series instead of 14


class Category(str, Enum):
    """Where a rank-second went. ``UNPROTECTED`` is provisional (see module docstring)."""

    PRODUCTIVE = "productive"
    UNPROTECTED = "unprotected"
    LOST = "lost"
    CHECKPOINT_BLOCKING = "checkpoint_blocking"
    CHECKPOINT_RESTORE = "checkpoint_restore"
    RESTART = "restart"
    INIT = "init"
    SHUTDOWN = "shutdown"
    DATA_WAIT = "data_wait"
    USER_SPAN = "user_span"  # planned work that is not training, in spans the user named (Hooks.span)
    UNATTRIBUTED = "unattributed"
    # Job level only (``exporter/offline/rollup.py``): rank-seconds of ranks the job's world size expects and
    # no pod accounted — a lost node until its replacement runs the rank, a pod scheduled late.
    ABSENT = "absent"


SETTLED_CATEGORIES: tuple[Category, ...] = tuple(c for c in Category
                                                 if c not in (Category.UNPROTECTED, Category.ABSENT))
BADPUT_CATEGORIES: tuple[Category, ...] = tuple(c for c in SETTLED_CATEGORIES if c is not Category.PRODUCTIVE)


class RestartLevel(str, Enum):
    INPROCESS = "inprocess"  # NVRx inprocess.Wrapper restarted the function inside the process
    INJOB = "injob"  # ft_launcher restarted the worker processes
    POD = "pod"  # the container/pod restarted (seen by the pod watcher or a new launcher)


class RestartPhase(str, Enum):
    DETECT = "detect"  # fault -> detected
    TEARDOWN = "teardown"  # detected -> old workers/state torn down
    RENDEZVOUS = "rendezvous"  # -> ranks re-assigned
    REINIT = "reinit"  # -> the restarted process/function is up again, before its restore
    RESTORE = "restore"  # checkpoint load in the restarted loop (its time is category checkpoint_restore)


class StepTimer(str, Enum):
    """How a rank's newest process times its steps (the journal's ``step_timing``)."""

    CUDA = "cuda"  # CUDA events on the stream of its device: the GPU's time
    HOST = "host"  # host clocks, in a process that does not use CUDA
    # host clocks in a process that uses CUDA: its phases time kernel launches, and the queued GPU
    # work lands where the host waits for it (data wait, checkpoint blocking)
    HOST_ON_GPU = "host_on_gpu"


class FaultCause(str, Enum):
    """Why a fault happened: the ``cause`` label of the seconds it cost (``lost`` and ``restart``
    rank-seconds; at job level also ``absent``). Decided once, by the engine, from what the journal
    and the launcher saw (docs/accounting.md defines each)."""

    EXCEPTION = "exception"  # an exception left a step, the Wrapper restarted on one, or a worker exited non-zero
    KILLED = "killed"  # a worker ended by a signal no one sends to stop a pod (SIGKILL: the OOM killer; SIGSEGV)
    HANG = "hang"  # a launcher or the Wrapper found ranks unresponsive (a timeout) with no exception or exit first
    PREEMPTED = "preempted"  # SIGTERM: the kubelet stopping the pod (deleted, preempted, evicted)
    STOPPED = "stopped"  # SIGINT or SIGHUP: a user's stop
    POD_LOST = "pod_lost"  # job level: a node or pod gone (its ranks absent, its work at risk lost)
    PEER_FAULT = "peer_fault"  # the pod's ranks were healthy: the job restarted for another pod's fault
    UNKNOWN = "unknown"  # a restart with no fault journaled (a launcher that journals nothing, a container restart)


class GpuIdleSource(str, Enum):
    NVML = "nvml"  # sampled utilisation from NVML
    STEP_PHASES = "step_phases"  # inferred from the journal: every second not in compute/optimizer


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()  # beyond IDENTITY_LABELS (and rank, if per_rank)
    per_rank: bool = False
    buckets: tuple[float, ...] = ()  # histograms only, exported; +Inf is implied

    @property
    def all_labels(self) -> tuple[str, ...]:
        return IDENTITY_LABELS + ((RANK_LABEL,) if self.per_rank else ()) + self.labels


# The engine's bucket bounds (its own histograms, in the report and the status page). A pod exports
# fewer (each metric's ``buckets``, a subset: the collector reads the cumulative counts at those
# bounds) — a series budget of 250 for an 8-rank pod — keeping the SLO thresholds exactly (10 s
# restart latency), so that histogram_quantile-free SLIs can use `le` directly.
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CHECKPOINT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
RESTART_BUCKETS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
CHECKPOINT_EXPORTED = (0.01, 0.1, 0.5, 1.0, 5.0, 30.0, 300.0)
RESTART_EXPORTED = (1.0, 5.0, 10.0, 30.0, 60.0, 300.0)


def _m(name: str, kind: Kind, help_: str, **kw: object) -> Metric:
    return Metric(PREFIX + name, kind, help_, **kw)  # type: ignore[arg-type]


WALL = _m("wall_seconds_total", Kind.COUNTER, "Rank-seconds of wall clock since this pod's first journaled start.",
          per_rank=True)
TIME = _m("time_seconds_total", Kind.COUNTER, "Settled rank-seconds by accounting category.", labels=("category",),
          per_rank=True)
UNPROTECTED_WORK = _m("unprotected_work_seconds", Kind.GAUGE,
                      "Rank-seconds of training since the last durable checkpoint (lost if a fault comes now).",
                      per_rank=True)
# A pod's sidecar dies with its node: the job-level rules count this pod's last value as badput
# once its series vanish (a lost pod's at-risk work is lost; a finished pod's is 0).
WORK_AT_RISK = _m("work_at_risk_seconds", Kind.GAUGE,
                  "Rank-seconds of this pod's unsettled time that no save or restore read so far keeps: "
                  "what the job loses if the pod goes now (0 once it finished).")
STEPS = _m("steps_total", Kind.COUNTER, "Training steps completed (including steps later rolled back).", per_rank=True)
TRAINING_STEP = _m("training_step", Kind.GAUGE, "Latest training step number reached by the pod's most advanced rank.")
LAST_STEP_TIMESTAMP = _m("last_step_timestamp_seconds", Kind.GAUGE, "Unix time of the latest completed step.",
                         per_rank=True)
# Per pod, not per rank: the status page names the ranks; the series budget stays (8 ranks, 250 series).
STEP_TIMING_RANKS = _m("step_timing_ranks", Kind.GAUGE,
                       "Ranks of the pod whose newest process times its steps so, by timer: cuda (CUDA events on "
                       "its device's stream), host (host clocks, no CUDA) or host_on_gpu (host clocks in a process "
                       "that uses CUDA: phases time kernel launches, and queued GPU work lands in data wait or "
                       "checkpoint blocking).", labels=("timer",))
STEP_DURATION = _m("step_duration_seconds", Kind.SUMMARY, "Duration of one training step.", per_rank=True)
JOB_START_TIMESTAMP = _m("job_start_timestamp_seconds", Kind.GAUGE,
                         "Unix time of this pod's first journaled start, the origin of its wall time; "
                         "the job's is its pods' earliest.")
# Every pod exports both: the job-level rules count the ranks no pod runs (a lost node, a pod not
# scheduled yet) as absent, against the job's world size.
JOB_WORLD_SIZE = _m("job_world_size", Kind.GAUGE,
                    "Ranks of the job: its processes' WORLD_SIZE, or its launcher's nodes × workers.")
POD_RANKS = _m("pod_ranks", Kind.GAUGE,
               "Ranks this pod runs: the ranks its processes journaled, or the workers its running launcher "
               "starts; 0 once it finished.")

CKPT_BLOCKING = _m("checkpoint_blocking_seconds", Kind.HISTOGRAM,
                   "Training-loop time stalled by one save (plan, staging, finalize).", buckets=CHECKPOINT_EXPORTED)
CKPT_BACKGROUND = _m("checkpoint_background_seconds", Kind.HISTOGRAM,
                     "Time one save spent writing in the background, overlapped with training.",
                     buckets=CHECKPOINT_EXPORTED)
CKPT_LAST_SUCCESS = _m("checkpoint_last_success_timestamp_seconds", Kind.GAUGE,
                       "Unix time the latest durable checkpoint finished writing.")
CKPT_LAST_STEP = _m("checkpoint_last_step", Kind.GAUGE, "Training step held by the latest durable checkpoint.")
CKPT_FAILURES = _m("checkpoint_failures_total", Kind.COUNTER, "Saves that failed.")
CKPT_IN_FLIGHT = _m("checkpoint_in_flight", Kind.GAUGE, "Saves scheduled and not yet durable or failed.")
CKPT_BYTES = _m("checkpoint_written_bytes_total", Kind.COUNTER, "Bytes written by durable saves.")
CKPT_WORKER_UP = _m("checkpoint_worker_up", Kind.GAUGE,
                    "1 if NVRx's persistent async checkpoint worker was last seen alive, 0 if dead.", per_rank=True)

RESTARTS = _m("restarts_total", Kind.COUNTER, "Restarts by level.", labels=("level",))
RESTART_DURATION = _m("restart_duration_seconds", Kind.HISTOGRAM,
                      "Fault to the first step of the restarted loop (all phases, restore included), by level.",
                      labels=("level",), buckets=RESTART_EXPORTED)
RESTART_PHASE = _m("restart_phase_seconds_total", Kind.COUNTER,
                   "Seconds restarts spent in each phase, by level and phase: over restarts_total, the mean per "
                   "restart (a restart's phases add up to its duration).", labels=("level", "phase"))
# From the launcher journal: launcher_start.max_restarts minus the current launcher's restart count.
LAUNCHER_RESTARTS_REMAINING = _m(
    "launcher_restarts_remaining", Kind.GAUGE,
    "Restarts ft_launcher may still make before the job fails (--max-restarts minus restarts so far).")
USER_SPAN_TIME = _m("user_span_seconds_total", Kind.COUNTER,
                    "Rank-seconds in the spans the user named (evaluation, SDC checks), by name: the "
                    "user_span category's breakdown (the first 16 names; later ones are \"other\").",
                    labels=("name",))
# Per pod, not per rank (a rank's fault costs its peers too), only the causes seen: with the lost and
# restart categories of nvrx_time_seconds_total it makes the cost of each cause (alerts/cost.py).
FAULT_TIME = _m("fault_seconds_total", Kind.COUNTER,
                "Rank-seconds of the lost and restart categories, by the cause of the fault that rolled the work "
                "back or forced the restart (a restart's once it is over).", labels=("cause",))
RANK_ACCELERATORS = _m("rank_accelerators", Kind.GAUGE,
                       "Accelerators each rank of this pod holds, by model (accelerator-seconds = rank-seconds × "
                       "this): NVML's product name, else --accelerator, else unknown.", labels=("accelerator",))
GPU_IDLE = _m("gpu_idle_seconds_total", Kind.COUNTER, "Rank-seconds the accelerator sat idle, by how it was measured.",
              labels=("source",), per_rank=True)

EXPORTER_EVENTS = _m("exporter_events_total", Kind.COUNTER, "Journal events accepted.")
EXPORTER_REJECTED = _m("exporter_rejected_events_total", Kind.COUNTER, "Journal lines rejected, by reason.",
                       labels=("reason",))
EXPORTER_RECORDS_LOST = _m(
    "exporter_journal_records_lost_total", Kind.COUNTER,
    "Journal records a process wrote that the sidecar never read (sequence gaps: rotated away before they were "
    "read, or a failed write).")
EXPORTER_LAG = _m("exporter_journal_lag_seconds", Kind.GAUGE, "Age of the newest event read, relative to now.")
POD_RESTARTS = _m("pod_container_restarts_total", Kind.COUNTER,
                  "Container restarts seen by the pod watcher, by container and reason.",
                  labels=("container", "reason"))

CATALOGUE: tuple[Metric, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Metric))
BY_NAME: dict[str, Metric] = {m.name: m for m in CATALOGUE}
