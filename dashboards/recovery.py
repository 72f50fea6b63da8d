"""Recovery: how often the job fails, how long each level of restart takes and where that time
goes (phases), and whether the checkpoint interval suits the failure rate (Young/Daly, ETTR)."""

from __future__ import annotations

from grafanalib import core as g

from dashboards import panels as p
from dashboards import queries as q
from exporter import catalogue as cat

UID = "nvrx-slo-recovery"

_SLO_S = f"{cat.RESTART_SLO_SECONDS:g} s"
_LEVEL = (q.LEVEL_LABEL,)
_PHASE = (q.LEVEL_LABEL, q.PHASE_LABEL)
_WITHIN_SLO = (f"{q.by((), q.series(cat.RESTART_DURATION, '_bucket', le=q.le_value(cat.RESTART_SLO_SECONDS)))}"
               f" / {q.by((), q.series(cat.RESTART_DURATION, '_count'))}")


def _summary() -> list[object]:
    return [
        p.stat("Restarts since job start", "Restarts by level: inprocess (NVRx Wrapper), injob (ft_launcher), pod.",
               [p.Query(q.by(_LEVEL, q.series(cat.RESTARTS)), "{{level}}")], p.COUNT, w=5),
        p.stat(f"Restarts back within {_SLO_S}", f"Share of restarts (all levels) from fault to the first step of "
               f"the restarted loop within {_SLO_S}, since job start. Objective {q.RESTART_LATENCY_OBJECTIVE:.0%}.",
               [p.Query(_WITHIN_SLO)], p.RATIO, steps=((None, p.RED), (q.RESTART_LATENCY_OBJECTIVE, p.GREEN)),
               decimals=1, w=5),
        p.stat("Mean restart latency", "Mean seconds from fault to the first step of the restarted loop (restore "
               "included), by level, since job start.",
               [p.Query(q.mean_per_event(cat.RESTART_DURATION, _LEVEL), "{{level}}")], p.SECONDS,
               steps=((None, p.GREEN), (cat.RESTART_SLO_SECONDS, p.RED)), w=5),
        p.stat("MTBF", "Mean wall time between faults observed in this job, per pod.",
               [p.Query(q.series(cat.MTBF), "{{pod}}")], p.SECONDS, w=4),
        p.stat("Predicted efficiency", "Efficiency the ETTR model predicts from measured MTBF, restart and "
               "checkpoint costs, per pod. Compare with the measured efficiency below.",
               [p.Query(q.series(cat.EFFICIENCY_PREDICTED), "{{pod}}")], p.RATIO,
               steps=((None, p.RED), (q.EFFICIENCY_OBJECTIVE, p.GREEN)), decimals=2, w=5),
    ]


def _detail() -> list[object]:
    return [
        p.timeseries("Restart latency by level", f"Mean and p99 seconds from fault to the restarted loop's first "
                     f"step, per level, over every restart since job start (steps up at each restart). Dashed: "
                     f"the {_SLO_S} objective.",
                     [p.Query(q.mean_per_event(cat.RESTART_DURATION, _LEVEL), "{{level}} mean"),
                      p.Query(q.quantile(0.99, cat.RESTART_DURATION, _LEVEL), "{{level}} p99")],
                     p.SECONDS, steps=((None, p.GREEN), (cat.RESTART_SLO_SECONDS, p.RED))),
        p.timeseries("Restart latency by phase", "Mean seconds per phase (detect, teardown, rendezvous, reinit, "
                     "restore) and level since job start, stacked: where a restart spends its time.",
                     [p.Query(q.mean_per_event(cat.RESTART_PHASE, _PHASE), "{{level}} {{phase}}")],
                     p.SECONDS, stack=True),
        p.timeseries("Restarts over time", "Restarts per dashboard interval, by level.",
                     [p.Query(q.delta(cat.RESTARTS, _LEVEL), "{{level}}")], p.COUNT, bars=True, w=8),
        p.timeseries("Checkpoint interval: optimal vs actual", "Measured mean time between durable checkpoints vs "
                     "the Young/Daly optimum √(2 · blocking cost · MTBF), per pod. Far above the optimum: a fault "
                     "loses more work than needed; far below: saves cost more than they protect.",
                     [p.Query(q.series(cat.CKPT_INTERVAL), "{{pod}} actual"),
                      p.Query(q.series(cat.CKPT_INTERVAL_OPTIMAL), "{{pod}} optimal")], p.SECONDS, w=8),
        p.timeseries("Efficiency: predicted vs measured", "ETTR-model prediction per pod against the measured "
                     f"productive / wall since job start. Dashed: the {q.EFFICIENCY_OBJECTIVE:.0%} objective.",
                     [p.Query(q.series(cat.EFFICIENCY_PREDICTED), "{{pod}} predicted"),
                      p.Query(q.efficiency(None), "measured")],
                     p.RATIO, steps=((None, p.RED), (q.EFFICIENCY_OBJECTIVE, p.GREEN)), w=8),
        p.timeseries("MTBF", "Mean wall time between faults observed in this job, per pod.",
                     [p.Query(q.series(cat.MTBF), "{{pod}}")], p.SECONDS, w=12),
        p.timeseries("Restart and restore share of wall", "Rank-seconds spent restarting and restoring, and work "
                     "lost to rollbacks, as shares of wall over the rate window.",
                     [p.Query(q.category_share((cat.Category.RESTART, cat.Category.CHECKPOINT_RESTORE,
                                                cat.Category.LOST), q.RATE_INTERVAL), "{{category}}")],
                     p.RATIO, stack=True, w=12),
    ]


def dashboard() -> g.Dashboard:
    return p.dashboard(
        uid=UID, title="nvrx-slo / Recovery", module="recovery",
        description=f"Faults and restarts for one job: {q.RESTART_LATENCY_OBJECTIVE:.0%} of restarts back to training "
                    f"within {_SLO_S}.",
        panels=[p.row("Since job start"), *_summary(), p.row("Latency, frequency and the checkpoint interval"),
                *_detail()],
    )
