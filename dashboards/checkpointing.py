"""Checkpointing: what each save costs the training loop (blocking) versus what it hides in the
background, whether saves land (age, in flight, failures, worker liveness) and how fast they write."""

from __future__ import annotations

from grafanalib import core as g

from nvrx_slo.alerts import duration
from nvrx_slo.alerts.conventions import Dashboard, Signal, over_period
from nvrx_slo.alerts.plan import Plan
from nvrx_slo.alerts.spec import Slo, Spec
from nvrx_slo.contracts import catalogue as cat
from nvrx_slo.dashboards import panels as p
from nvrx_slo.dashboards import queries as q

UID = Dashboard.CHECKPOINTING.value  # stable: the alerts link to it

_POD = (q.POD_LABEL,)
_BLOCKING = (cat.Category.CHECKPOINT_BLOCKING,)


def _limits(spec: Spec) -> tuple[float, float]:
    """(most blocking share of wall, least overlap) the checkpoint SLOs allow."""
    return round(spec.objectives[Slo.CHECKPOINT_BLOCKING].budget, 9), spec.objectives[Slo.CHECKPOINT_OVERLAP].target


def _summary(spec: Spec, plan: Plan) -> list[object]:
    blocking_max, overlap_min = _limits(spec)
    return [
        p.stat("Blocking share of wall", f"checkpoint_blocking / wall rank-seconds since job start. Objective ≤ "
               f"{blocking_max:.0%}.", [p.Query(q.badput_ratio(None, _BLOCKING))], p.RATIO,
               steps=((None, p.GREEN), (blocking_max, p.RED)), decimals=2, w=4),
        p.stat("Overlap", f"background / (blocking + background) seconds of the job's saves over "
               f"{q.period_text(plan)} (every pod's, a lost one's too). Objective ≥ {overlap_min:.0%}.",
               [p.Query(q.job_record(over_period(Signal.OVERLAP, plan)))], p.RATIO,
               steps=((None, p.RED), (overlap_min, p.GREEN)), decimals=1, w=4),
        p.stat("Mean seconds per save", "Mean blocking and background seconds per save since job start, over all "
               "pods.", [p.Query(q.mean_per_event(cat.CKPT_BLOCKING), "blocking"),
                         p.Query(q.mean_per_event(cat.CKPT_BACKGROUND), "background")], p.SECONDS, w=4),
        p.stat("Latest durable step", "Training step held by the latest durable checkpoint, per pod: a restart "
               "resumes here.", [p.Query(q.series(cat.CKPT_LAST_STEP), "{{pod}}")], p.COUNT, w=4),
        p.stat("Failed saves", "Saves that failed since job start, per pod.",
               [p.Query(q.by(_POD, q.series(cat.CKPT_FAILURES)), "{{pod}}")], p.COUNT,
               steps=((None, p.GREEN), (1.0, p.RED)), w=4),
        p.stat("Write throughput", "Bytes written per second of background writing since job start "
               "(durable bytes / background seconds), all pods: the storage speed a save sees.",
               [p.Query(f"{q.by((), q.series(cat.CKPT_BYTES))} / "
                        f"({q.by((), q.series(cat.CKPT_BACKGROUND, '_sum'))} > 0)")],
               p.BYTES_PER_SECOND, w=4),
    ]


def _over_time(spec: Spec, plan: Plan) -> list[object]:
    blocking_max, overlap_min = _limits(spec)
    stale = spec.alerts.checkpoint_stale_after
    return [
        p.timeseries("Blocking vs background seconds per save", "Mean seconds per save over the rate window: "
                     "blocking stalls the training loop; background overlaps it. No line where no save finished.",
                     [p.Query(q.mean_per_event(cat.CKPT_BLOCKING, window=q.RATE_INTERVAL), "blocking"),
                      p.Query(q.mean_per_event(cat.CKPT_BACKGROUND, window=q.RATE_INTERVAL), "background"),
                      p.Query(q.quantile(0.9, cat.CKPT_BLOCKING, window=q.RATE_INTERVAL), "blocking p90")],
                     p.SECONDS),
        p.timeseries("Blocking share of wall", f"checkpoint_blocking / wall rank-seconds, since job start and over the "
                     f"rate window. Dashed: the {blocking_max:.0%} objective.",
                     [p.Query(q.badput_ratio(None, _BLOCKING), "since job start"),
                      p.Query(q.badput_ratio(q.RATE_INTERVAL, _BLOCKING), "over rate window")],
                     p.RATIO, steps=((None, p.GREEN), (blocking_max, p.RED))),
        p.timeseries("Overlap ratio", f"background / (blocking + background) seconds of the job's saves over "
                     f"{q.period_text(plan)}. Dashed: the {overlap_min:.0%} objective.",
                     [p.Query(q.job_record(over_period(Signal.OVERLAP, plan)), "job")],
                     p.RATIO, steps=((None, p.RED), (overlap_min, p.GREEN)), w=8),
        p.timeseries("Checkpoint age", "Seconds since the latest durable checkpoint finished writing, per pod: "
                     "the work a fault would throw away grows with it. Dashed: the stale-checkpoint alert's "
                     f"{duration.format(stale)}.",
                     [p.Query(f"time() - {q.series(cat.CKPT_LAST_SUCCESS)}", "{{pod}}")], p.SECONDS,
                     steps=((None, p.GREEN), (float(stale), p.RED)), w=8),
        p.timeseries("Saves in flight", "Saves scheduled and not yet durable or failed, per pod. Stuck above 0 "
                     "means the background writer is not finishing.",
                     [p.Query(q.series(cat.CKPT_IN_FLIGHT), "{{pod}}")], p.COUNT, w=8),
        p.timeseries("Failed saves", "Saves that failed within each rate window, per pod.",
                     [p.Query(q.by(_POD, q.increase(cat.CKPT_FAILURES, q.RATE_INTERVAL)), "{{pod}}")],
                     p.COUNT, bars=True, w=8),
        p.timeseries("Write throughput", "Bytes made durable per second over the rate window, per pod (bursty: "
                     "bytes count when a save lands).",
                     [p.Query(q.by(_POD, q.rate(cat.CKPT_BYTES)), "{{pod}}")], p.BYTES_PER_SECOND, w=8),
        p.timeseries("Async checkpoint worker up", "1 while NVRx's persistent async checkpoint worker was last seen "
                     "alive, 0 if it died (saves will then never finish), per rank.",
                     [p.Query(q.by((q.POD_LABEL, q.RANK_LABEL), q.series(cat.CKPT_WORKER_UP), "min"),
                              "{{pod}} rank {{rank}}")],
                     p.COUNT, steps=((None, p.RED), (1.0, p.GREEN)), w=8),
    ]


def dashboard(spec: Spec, plan: Plan) -> g.Dashboard:
    blocking_max, overlap_min = _limits(spec)
    return p.dashboard(
        uid=UID, title="nvrx-slo / Checkpointing", module="checkpointing",
        description=f"Checkpoint cost and health for one job: blocking ≤ {blocking_max:.0%} of wall, "
                    f"overlap ≥ {overlap_min:.0%}.",
        panels=[p.row("Since job start"), *_summary(spec, plan), p.row("Over time"), *_over_time(spec, plan)],
    )
